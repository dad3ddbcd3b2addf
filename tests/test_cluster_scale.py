"""Clustering at scale: fit on a seeded sample, nearest exemplar for the rest; coarse-then-fine KMeans."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.selection import cluster_features
from hf_cluster_select.selection.sampled import exemplars_of, nearest_labels, seeded_sample


def mixture(n: int, k: int = 6, dim: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * 4
    truth = rng.integers(0, k, size=n)
    return centres[truth] + rng.normal(size=(n, dim)), truth


def test_nearest_labels_by_blocks():
    """The label of the nearest exemplar, the same whatever the block size; ties go to the first exemplar."""
    exemplars = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = np.array([[1.0, 1.0], [9.0, -1.0], [-1.0, 8.0], [5.0, 0.0]])
    labels = np.array([7, 8, 9])
    assert nearest_labels(points, exemplars, labels).tolist() == [7, 8, 9, 7]
    assert nearest_labels(points, exemplars, labels, block=1).tolist() == [7, 8, 9, 7]


def test_seeded_sample_and_exemplars():
    assert seeded_sample(100, None, 0) is None and seeded_sample(100, 100, 0) is None
    a, b = seeded_sample(1000, 50, 3), seeded_sample(1000, 50, 3)
    assert np.array_equal(a, b) and a.size == 50 and np.all(np.diff(a) > 0)
    points = np.arange(20, dtype=float)[:, None]
    labels = np.array([0] * 10 + [1] * 5 + [-1] * 5)
    rows, row_labels = exemplars_of(points, labels, seed=0, per_cluster=4)
    assert np.bincount(row_labels).tolist() == [4, 4] and -1 not in row_labels.tolist()


def test_hdbscan_on_a_sample_recovers_the_full_fit():
    """3,000 rows of 6 separated components: HDBSCAN on a 600-row sample plus nearest-exemplar assignment agrees
    with the truth as well as the fit on every row, and every row gets a cluster."""
    x, truth = mixture(3000)
    full = cluster_features(x, ClusterSelectConfig(cluster_method="hdbscan", strategy_kwargs={"cluster_sample_size": None}))
    sampled = cluster_features(x, ClusterSelectConfig(cluster_method="hdbscan", strategy_kwargs={"cluster_sample_size": 600}))
    assert sampled.params["sampled_rows"] == 600 and "sampled_rows" not in full.params
    assert adjusted_rand_score(truth, full.labels) > 0.95
    assert adjusted_rand_score(truth, sampled.labels) > 0.95
    assert adjusted_rand_score(full.labels, sampled.labels) > 0.95
    assert sampled.labels.shape == (3000,) and sampled.labels.min() == 0


def test_fine_kmeans_two_level_has_about_k_clusters():
    """Above the sample size, fine_kmeans finds K = budget / kept_per_cluster clusters coarse-then-fine; each
    true component is split, never merged with another (homogeneous clusters)."""
    x, truth = mixture(4000, k=5)
    config = ClusterSelectConfig(data_fraction=0.1, strategy_kwargs={"cluster_sample_size": 500})  # budget 400 -> K = 100
    result = cluster_features(x, config)
    assert result.params["assignment"] == "two_level_kmeans" and result.params["sampled_rows"] == 500
    assert 90 <= result.n_clusters <= 100
    purity = sum(np.bincount(truth[result.labels == c]).max() for c in range(result.n_clusters)) / truth.size
    assert purity > 0.99
    small = cluster_features(x[:400], ClusterSelectConfig(data_fraction=0.1, strategy_kwargs={"cluster_sample_size": 500}))
    assert "assignment" not in small.params  # below the size: the exact fit, unchanged


def test_kmeans_on_a_sample_keeps_the_size_cap():
    x, truth = mixture(2000, k=3)
    result = cluster_features(x, ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={"kmeans_n_clusters": 3, "cluster_sample_size": 300}))
    assert result.params["sampled_rows"] == 300 and adjusted_rand_score(truth, result.labels) > 0.95
    x, _ = mixture(3000, k=4, seed=2)
    for size in (None, 1000, 100):  # the cap (1.1 · n / K = 825) holds on every row, sampled or not
        capped = cluster_features(x, ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={"kmeans_n_clusters": 4, "kmeans_size_cap": 1.1, "cluster_sample_size": size}))
        assert np.bincount(capped.labels).max() <= 825 and capped.labels.size == 3000


@pytest.mark.parametrize("size", [0, 99, 2.5, True])
def test_cluster_sample_size_validated(size):
    with pytest.raises((ValueError, TypeError), match="cluster_sample_size"):
        ClusterSelectConfig(strategy_kwargs={"cluster_sample_size": size})


def test_blockwise_path_for_a_memory_mapped_matrix(tmp_path, monkeypatch):
    """Above LARGE_INPUT_BYTES the rows are read in blocks from a memory-mapped file: duplicates still share a
    duplicate group, a NaN row is screened out, and the clusters are the in-memory path's."""
    from hf_cluster_select.selection import clustering

    x, truth = mixture(1200, k=4)
    x[10] = x[11]  # an exact duplicate
    x[20] = np.nan
    path = tmp_path / "features.f32"
    mapped = np.memmap(path, dtype=np.float32, mode="w+", shape=x.shape)
    mapped[:] = x
    config = ClusterSelectConfig(cluster_method="hdbscan")
    in_memory = cluster_features(np.asarray(x), config)
    monkeypatch.setattr(clustering, "LARGE_INPUT_BYTES", 1024)
    monkeypatch.setattr(clustering, "BLOCK_ROWS", 100)
    blockwise = cluster_features(mapped, config)
    assert blockwise.params["n_unique"] == in_memory.params["n_unique"] == 1198  # 1,200 − duplicate − NaN row
    assert blockwise.groups[10] == blockwise.groups[11] and blockwise.raw_labels[20] == -2
    keep = np.arange(1200) != 20
    assert adjusted_rand_score(in_memory.labels[keep], blockwise.labels[keep]) > 0.99
    assert adjusted_rand_score(truth[keep], blockwise.labels[keep]) > 0.95


def test_feature_storage_spills_to_a_memory_mapped_file(tmp_path, monkeypatch):
    import os

    import torch

    from hf_cluster_select.features.head_pass import feature_storage

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    small = feature_storage(4, 3, limit_bytes=1 << 20)
    big = feature_storage(1000, 64, limit_bytes=1024)
    assert isinstance(small, torch.Tensor) and float(small.abs().sum()) == 0.0
    if os.path.exists("/proc/self/maps"):  # Linux: the tensor's memory is a (deleted) temporary file's mapping
        pointer = big.data_ptr()
        for line in open("/proc/self/maps"):
            span, *rest = line.split()
            low, high = (int(v, 16) for v in span.split("-"))
            if low <= pointer < high:
                assert "hf_cluster_select_features_" in line and "(deleted)" in line
                break
        else:
            raise AssertionError("the feature tensor's memory is not mapped")
    big[3] = 1.0
    assert float(big.sum()) == 64.0 and big.shape == (1000, 64)
    assert os.listdir(tmp_path) == []  # the file is unlinked at once: nothing left behind


def test_a_float32_matrix_is_read_in_blocks_when_its_float64_copy_would_be_too_large(monkeypatch):
    """The limit is on the float64 copy (8 bytes per value), not on the input's own bytes: 100 × 4 float32 values
    (1,600 bytes, 3,200 as float64) are read in blocks under a 2,000-byte limit, 50 × 4 are copied."""
    from hf_cluster_select.selection import clustering

    monkeypatch.setattr(clustering, "LARGE_INPUT_BYTES", 2000)
    assert clustering._read_in_blocks(np.zeros((100, 4), dtype=np.float32))
    assert not clustering._read_in_blocks(np.zeros((50, 4), dtype=np.float32))
    assert not clustering._read_in_blocks(np.zeros((100, 4), dtype=np.int64))  # not a float matrix: copied
    x = np.asarray(mixture(100, k=3, dim=4)[0], dtype=np.float32)
    assert clustering._as_float_matrix(x) is x  # no copy


def test_fine_kmeans_adds_a_third_level_above_max_branch_squared(monkeypatch, request):
    """With MAX_BRANCH = 4 (a third level above 16 fine clusters), K = 100 is found as ∛K = 5 coarse groups, each
    split coarse-then-fine again: still about K clusters, each inside one true component; at or below MAX_BRANCH²
    the labels are exactly the two-level ones."""
    from hf_cluster_select.selection import sampled

    x, truth = mixture(4000, k=5)
    config = ClusterSelectConfig(data_fraction=0.1, strategy_kwargs={"cluster_sample_size": 500})  # K = 100
    two_levels = cluster_features(x, config)
    monkeypatch.setattr(sampled, "MAX_BRANCH", 10)  # 100 <= 10²: still two levels, the same labels
    assert np.array_equal(cluster_features(x, config).labels, two_levels.labels)
    monkeypatch.setattr(sampled, "MAX_BRANCH", 4)
    calls = request.getfixturevalue("two_level_calls")
    three_levels = cluster_features(x, config)
    # the inner splits (the first call comes from kmeans_clusterer's own import): the coarse groups' shares of K
    first = [k for level, k in calls if level == 0]  # the coarse groups' shares of K (above MAX_BRANCH: split again)
    assert len(first) >= 3 and all(4 < k <= 50 for k in first) and sum(first) <= 100
    deeper = [k for level, k in calls if level == 1]  # a share still above MAX_BRANCH² = 16 is split a level deeper
    assert all(4 < k < 20 for k in deeper) and len(deeper) >= sum(k > 16 for k in first)
    assert 90 <= three_levels.n_clusters <= 100
    purity = sum(np.bincount(truth[three_levels.labels == c]).max()
                 for c in range(three_levels.n_clusters)) / truth.size
    assert purity > 0.99
    assert "assign" in three_levels.params["stage_seconds"]
