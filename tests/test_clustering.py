"""Tests of hf_cluster_select.clustering and _imports on small synthetic arrays."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from tiny_assets import hdbscan_config
from sklearn.metrics import adjusted_rand_score

from hf_cluster_select._imports import require_hdbscan
from hf_cluster_select.selection import cluster_features
from hf_cluster_select.config import ClusterSelectConfig


def _blobs(seed: int = 0, sizes=(50, 50, 50, 50), dim: int = 10, spread: float = 0.2):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim)) * 3
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return centers[truth] + spread * rng.normal(size=(truth.size, dim)), truth


def _check_partition(result, n):
    assert result.labels.shape == (n,) and result.labels.dtype == np.int64
    assert result.raw_labels.shape == (n,) and result.raw_labels.dtype == np.int64
    assert result.reduced.shape[0] == n and result.reduced.dtype == np.float32
    assert np.array_equal(np.unique(result.labels), np.arange(result.n_clusters))  # contiguous, none empty


def test_well_separated_blobs_recovered_exactly():
    features, truth = _blobs()
    result = cluster_features(features, hdbscan_config())
    _check_partition(result, 200)
    assert result.n_clusters == 4
    assert adjusted_rand_score(truth, result.labels) == 1.0
    assert result.fallback is None and result.method == "hdbscan"
    assert result.params["pca_dim"] == 10  # min(16, n_unique - 1, dim)
    assert result.params["min_cluster_size"] == 6  # round(sqrt(200) / 2.5)
    assert result.params["min_samples"] == 1 and result.params["n_unique"] == 200
    assert result.params["seconds"] >= 0.0
    assert result.reduced.shape == (200, 10)


def test_torch_input_matches_numpy():
    torch = pytest.importorskip("torch")
    features, _ = _blobs()
    from_numpy = cluster_features(features, hdbscan_config())
    from_torch = cluster_features(torch.tensor(features, dtype=torch.float64), hdbscan_config())
    assert np.array_equal(from_numpy.labels, from_torch.labels)


def test_deterministic_for_a_seed():
    features, _ = _blobs(seed=3, sizes=(40, 25, 60), spread=1.0)
    for config in (hdbscan_config(), hdbscan_config(cluster_method="kmeans", kmeans_n_clusters=3)):
        first, second = cluster_features(features, config), cluster_features(features, config)
        assert np.array_equal(first.labels, second.labels)
        assert np.array_equal(first.raw_labels, second.raw_labels)
        assert np.array_equal(first.reduced, second.reduced)


def test_one_dense_group_and_one_outlier():
    rng = np.random.default_rng(1)
    rng.normal(size=(20, 2))  # keep the stream of the exploration that found this all-noise case
    rng.normal(size=(40, 4))
    features = np.vstack([rng.normal(size=(50, 8)) * 0.05 + np.eye(8)[0], -np.ones((1, 8))])
    result = cluster_features(features, hdbscan_config())
    _check_partition(result, 51)
    # HDBSCAN alone labels everything noise here; the single-cluster refit keeps one cluster.
    assert result.params["allow_single_cluster"] is True
    assert "allow_single_cluster" in result.fallback
    assert result.n_clusters == 1 and result.raw_labels[-1] == -1
    own = cluster_features(features, hdbscan_config(noise_policy="own_cluster"))
    assert own.n_clusters == 2 and own.labels[-1] == 1
    assert np.array_equal(own.labels == 1, own.raw_labels == -1)


def test_identical_rows_give_one_cluster():
    row = np.random.default_rng(0).normal(size=8)
    result = cluster_features(np.tile(row, (600, 1)), hdbscan_config())
    _check_partition(result, 600)
    assert result.n_clusters == 1 and result.fallback is not None and result.params["n_unique"] == 1
    assert (result.labels == 0).all()


def test_two_piles_of_duplicates_are_two_clusters():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=8), rng.normal(size=8)
    features = np.vstack([np.tile(a, (300, 1)), np.tile(b, (300, 1))])
    for policy in ("assign", "own_cluster"):
        result = cluster_features(features, hdbscan_config(noise_policy=policy))
        _check_partition(result, 600)
        assert result.n_clusters == 2 and result.n_noise == 0 and result.params["n_piles"] == 2
        assert len(set(result.labels[:300])) == 1 and len(set(result.labels[300:])) == 1
        assert result.labels[0] != result.labels[-1]
    # Two piles and one lone row: the lone row joins the nearer pile, or forms the noise cluster.
    lone = a + 0.1 * rng.normal(size=8)
    with_lone = np.vstack([features, lone])
    assigned = cluster_features(with_lone, hdbscan_config())
    assert assigned.n_clusters == 2 and assigned.labels[-1] == assigned.labels[0] and assigned.n_noise == 1
    own = cluster_features(with_lone, hdbscan_config(noise_policy="own_cluster"))
    assert own.n_clusters == 3 and own.labels[-1] == 2 and (np.bincount(own.labels) == [300, 300, 1]).all()


def test_pile_next_to_hdbscan_clusters():
    features, truth = _blobs(sizes=(60, 60, 60))
    pile = np.tile(np.random.default_rng(5).normal(size=10) * 3, (100, 1))
    result = cluster_features(np.vstack([features, pile]), hdbscan_config())
    assert result.n_clusters == 4 and result.params["n_piles"] == 1
    assert adjusted_rand_score(np.r_[truth, np.full(100, 3)], result.labels) == 1.0


def test_single_example_and_too_few_examples():
    single = cluster_features(np.ones((1, 5)), hdbscan_config())
    _check_partition(single, 1)
    assert single.n_clusters == 1 and single.fallback is not None and single.params["pca_dim"] is None
    rng = np.random.default_rng(0)
    few = cluster_features(rng.normal(size=(4, 8)), hdbscan_config())
    assert few.n_clusters == 1 and "min_cluster_size=5" in few.fallback
    below = cluster_features(rng.normal(size=(30, 8)), hdbscan_config(hdbscan_min_cluster_size=40))
    assert below.n_clusters == 1 and "min_cluster_size=40" in below.fallback
    assert cluster_features(np.zeros((3, 4)), hdbscan_config()).n_clusters == 1  # zero rows stay zero


def test_noise_policies():
    features, truth = _blobs(sizes=(60, 60, 60))
    rng = np.random.default_rng(7)
    scattered = rng.uniform(-6, 6, size=(15, 10))
    data = np.vstack([features, scattered])
    assigned = cluster_features(data, hdbscan_config())
    own = cluster_features(data, hdbscan_config(noise_policy="own_cluster"))
    assert assigned.n_noise == own.n_noise > 0
    clustered = assigned.raw_labels >= 0
    assert np.array_equal(assigned.labels[clustered], assigned.raw_labels[clustered])
    assert assigned.n_clusters == 3 and (assigned.labels >= 0).all()
    assert own.n_clusters == 4
    assert np.array_equal(own.labels == 3, own.raw_labels == -1)
    assert adjusted_rand_score(truth, assigned.labels[:180]) == 1.0


def test_kmeans_cap_respected():
    features, truth = _blobs(sizes=(300, 150, 100, 50))
    free = cluster_features(features, hdbscan_config(cluster_method="kmeans", kmeans_n_clusters=4, pca_dim=None))
    assert free.method == "kmeans" and adjusted_rand_score(truth, free.labels) == 1.0
    assert np.array_equal(free.labels, free.raw_labels)
    config = hdbscan_config(cluster_method="kmeans", kmeans_n_clusters=4, kmeans_size_cap=1.2)
    capped = cluster_features(features, config)
    _check_partition(capped, 600)
    assert capped.params["size_cap_examples"] == 180
    assert np.bincount(capped.labels).max() <= 180 and capped.n_clusters == 4
    exact = cluster_features(
        features, hdbscan_config(cluster_method="kmeans", kmeans_n_clusters=4, kmeans_size_cap=1.0)
    )
    assert (np.bincount(exact.labels) == 150).all()


def test_kmeans_k_from_world_size_and_clipping():
    features, _ = _blobs(sizes=(30, 30, 30))
    assert cluster_features(features, hdbscan_config(cluster_method="kmeans"), world_size=3).n_clusters == 3
    assert cluster_features(features, hdbscan_config(cluster_method="kmeans")).n_clusters == 2
    two_rows = np.vstack([np.tile([1.0, 0.0], (5, 1)), np.tile([0.0, 1.0], (5, 1))])
    clipped = cluster_features(two_rows, hdbscan_config(cluster_method="kmeans", kmeans_n_clusters=4))
    assert clipped.n_clusters == 2 and "clipped" in clipped.fallback
    assert clipped.labels[0] != clipped.labels[-1]


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.ones(5), "2-D"),
        (np.ones((0, 3)), "at least one example"),
        (np.array([["a", "b"]]), "numbers"),
    ],
)
def test_rejects_bad_features(bad, message):
    with pytest.raises(ValueError, match="`features`") as info:
        cluster_features(bad, hdbscan_config())
    assert message in str(info.value)


def test_rejects_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        cluster_features(np.ones((3, 2)), hdbscan_config(), world_size=0)


def test_require_hdbscan_explains_the_fix(monkeypatch):
    assert require_hdbscan().__name__ == "hdbscan"
    monkeypatch.setitem(sys.modules, "hdbscan", None)  # makes `import hdbscan` raise ImportError
    with pytest.raises(ImportError) as info:
        require_hdbscan()
    for hint in ("pip install hdbscan", "numpy", "cluster_method='kmeans'"):
        assert hint in str(info.value)
    features, _ = _blobs(sizes=(20, 20))
    assert cluster_features(features, hdbscan_config(cluster_method="kmeans")).n_clusters == 2


def test_package_imports_without_hdbscan():
    code = (
        "import sys; sys.modules['hdbscan'] = None\n"
        "import hf_cluster_select, hf_cluster_select.selection.clustering, hf_cluster_select.selection\n"
        "assert sys.modules['hdbscan'] is None\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0, 1e4])
@pytest.mark.parametrize("method", ["hdbscan", "fine_kmeans"])
def test_near_duplicate_piles_one_label_per_pile_at_every_scale(scale, method):
    """Three piles of 50 rows equal up to 1e-7 jitter (16 dims), a NaN row and a constant row: each pile is one
    merged row of weight 50 and gets one label of its own, whatever the scale of the matrix (issue 11, item 7)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16))
    piles = np.concatenate([c + 1e-7 * rng.normal(size=(50, 16)) for c in centres])
    features = np.vstack([piles, np.full((1, 16), np.nan), np.full((1, 16), 0.5)]) * scale
    config = hdbscan_config() if method == "hdbscan" else ClusterSelectConfig(data_fraction=0.1)
    result = cluster_features(features, config)
    _check_partition(result, 152)
    pile_labels = [set(result.labels[i * 50:(i + 1) * 50].tolist()) for i in range(3)]
    assert [len(s) for s in pile_labels] == [1, 1, 1]
    assert len(set.union(*pile_labels)) == 3
    assert result.params["n_unique"] == 4  # three piles and the constant row; the NaN row is screened out
    assert result.n_nonfinite == 1


def test_duplicate_groups_tolerate_grid_boundaries_and_keep_order():
    from hf_cluster_select.selection.duplicates import DUPLICATE_TOLERANCE, cell_codes, duplicate_groups

    # two rows that straddle a cell boundary of the plain grid share a cell of the shifted one
    boundary = 0.3 // DUPLICATE_TOLERANCE * DUPLICATE_TOLERANCE
    rows = np.array([[boundary - 1e-9, 0.0], [boundary + 1e-9, 0.0], [0.0, 0.5], [0.3, 0.2]])
    inverse, first, counts = duplicate_groups([cell_codes(rows[:2]), cell_codes(rows[2:])])
    assert inverse.tolist() == [0, 0, 1, 2] and first.tolist() == [0, 2, 3] and counts.tolist() == [2, 1, 1]
    # rows 2e-5 apart (two grid steps) stay distinct
    inverse, _, _ = duplicate_groups([cell_codes(np.array([[0.6, 0.8], [0.6 + 2e-5, 0.8]]))])
    assert inverse.tolist() == [0, 1]
