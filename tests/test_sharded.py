"""`select_sharded`: exact budget, duplicates, NaN and deferred rows, bad input, and the same selection on 4 gloo
ranks as in one process."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from sklearn.metrics import homogeneity_score

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.selection.sharded import select_sharded
from hf_cluster_select.selection.sharded_owner import _owners

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed"))

from launch import torchrun  # noqa: E402
from sharded_pools import POOLS, pool, shard_of  # noqa: E402


def _one_process(name: str):
    data = pool(name)
    n = data["features"].shape[0]
    extras = {key: data[key] for key in ("loss_tokens", "norms", "losses") if key in data}
    return data, select_sharded(data["features"], np.arange(n), n, data["config"], **extras)


def test_exact_budget_weights_and_homogeneous_clusters():
    data, selection = _one_process("plain")
    assert selection.n_kept == 900 and selection.n_total == 3000
    assert np.array_equal(selection.indices, np.unique(selection.indices))
    assert selection.weights.sum() == pytest.approx(3000.0)
    # K = 900 / 4 = 225 fine clusters; every kept example's cluster lies inside one blob
    assert selection.labels.max() < 225 and np.unique(selection.labels).size > 200
    assert homogeneity_score(data["truth"][selection.indices], selection.labels) > 0.99
    assert {"screen", "pca", "assign", "route", "fit", "quotas", "within_cluster", "gather"} <= set(
        selection.stage_seconds)


def test_duplicates_nan_and_deferred_rows():
    data, selection = _one_process("messy")
    kept = set(selection.indices.tolist())
    assert selection.n_kept == 900 and selection.weights.sum() == pytest.approx(3000.0)
    assert len(kept & set(data["copies"].tolist())) == 1  # 41 identical rows take one slot
    copy = selection.indices[np.isin(selection.indices, data["copies"])][0]
    assert copy == 7  # the group's first copy
    assert selection.weights[selection.indices == 7][0] > 30  # and it stands for its 41 copies
    assert not kept & set(data["deferred"].tolist())  # no loss-bearing token: not needed for this budget
    nan_kept = np.isin(selection.indices, data["nonfinite"])
    assert nan_kept.sum() == 2  # 6 NaN rows form the last cluster, kept in proportion (6 × 0.3, rounded up)
    assert (selection.labels[nan_kept] == selection.labels.max()).all()


def test_the_budget_above_the_eligible_rows_keeps_them_all_then_deferred_ones_by_index():
    data = pool("messy")
    config = ClusterSelectConfig(data_fraction=0.995, strategy_kwargs={"cluster_sample_size": 500})
    selection = select_sharded(data["features"], np.arange(3000), 3000, config, loss_tokens=data["loss_tokens"])
    assert selection.n_kept == 2985  # 2,975 eligible + the 10 lowest-index deferred rows
    assert np.array_equal(np.setdiff1d(selection.indices, np.setdiff1d(np.arange(3000), data["deferred"])),
                          data["deferred"][:10])
    assert np.allclose(selection.weights, 3000 / 2985)


def test_owners_balance_rows_largest_group_first():
    assert _owners(np.array([5, 9, 1, 7]), 2).tolist() == [1, 0, 0, 1]
    assert _owners(np.array([4, 4, 4]), 3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("kwargs, message", [
    (dict(cluster_method="hdbscan"), "cluster_method='hdbscan'"),
    (dict(budget_unit="tokens"), "budget_unit='tokens'"),
    (dict(stratify_column="task"), "stratify_column='task'"),
])
def test_unsupported_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_sharded(np.ones((10, 2)), np.arange(10), 10, ClusterSelectConfig(**kwargs))


def test_bad_shards_are_named():
    x = np.random.default_rng(0).normal(size=(10, 3))
    with pytest.raises(ValueError, match="`local_indices` has 9 entries"):
        select_sharded(x, np.arange(9), 10, ClusterSelectConfig())
    with pytest.raises(ValueError, match="distinct dataset indices"):
        select_sharded(x, np.r_[0:9, 0], 10, ClusterSelectConfig())
    with pytest.raises(ValueError, match="hold 10 rows in all but `n_examples` is 12"):
        select_sharded(x, np.arange(10), 12, ClusterSelectConfig())
    with pytest.raises(TypeError, match="ClusterSelectConfig"):
        select_sharded(x, np.arange(10), 10, {"data_fraction": 0.3})
    with pytest.raises(ValueError, match="1-D sequence of ints, got shape \\(10,\\), dtype float64"):
        select_sharded(x, np.arange(10) + 0.5, 10, ClusterSelectConfig())
    with pytest.raises(ValueError, match="1-D sequence of ints, got shape \\(10, 1\\)"):
        select_sharded(x, np.arange(10)[:, None], 10, ClusterSelectConfig())


@pytest.mark.distributed
def test_four_ranks_select_what_one_process_selects(tmp_path):
    torchrun([os.path.join("tests", "distributed", "sharded_worker.py"), str(tmp_path)], nproc=4, timeout=300)
    for name in POOLS:
        _, expected = _one_process(name)
        for rank in range(4):
            got = np.load(tmp_path / name / f"rank{rank}.npz")
            assert np.array_equal(got["indices"], expected.indices), (name, rank)
            assert np.array_equal(got["labels"], expected.labels), (name, rank)
            np.testing.assert_allclose(got["weights"], expected.weights, rtol=1e-12)
    assert sorted(np.concatenate([shard_of(3000, r, 4) for r in range(4)]).tolist()) == list(range(3000))
    for rank in range(4):  # a bad input on one rank, or ranks that disagree: the same ValueError on every rank
        errors = json.loads((tmp_path / "errors" / f"rank{rank}.json").read_text())
        assert "do not cover range(3000) exactly once" in errors["overlap"]
        assert "every rank must pass the same `config`" in errors["config"]
        assert errors["one_rank"].startswith("select_sharded: rank 3: `local_indices` has 749 entries")


def test_exchange_and_sum_without_a_process_group_are_the_identity():
    import torch

    from hf_cluster_select import distributed

    rows = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(distributed.exchange_rows([rows])[0], rows)
    assert torch.equal(distributed.all_sum(torch.tensor([3, 4])), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="one tensor per rank"):
        distributed.exchange_rows([rows, rows])


def test_the_clustering_numbers_nan_and_deferred_rows_last():
    data = pool("messy")
    selection, clustering = select_sharded(data["features"], np.arange(3000), 3000, data["config"],
                                           loss_tokens=data["loss_tokens"], return_clustering=True)
    assert clustering.labels.shape == (3000,) and np.array_equal(clustering.labels[selection.indices],
                                                                  selection.labels)
    n_fine = clustering.n_clusters - 2
    assert (clustering.labels[data["nonfinite"]] == n_fine).all()
    assert (clustering.raw_labels[data["nonfinite"]] == -2).all()
    assert (clustering.labels[data["deferred"]] == n_fine + 1).all()
    assert (clustering.raw_labels[data["deferred"]] == -3).all()
    assert len(set(clustering.labels[data["copies"]].tolist())) == 1  # copies share a cluster
    assert clustering.params["sharded"] and clustering.params["n_no_loss_tokens"] == 25
    assert clustering.params["n_nonfinite_features"] == 6 and clustering.params["pca_dim"] == 8


def test_the_sharded_setting_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match=r"`sharded`=True .* \[\"stratify_column='task'\"\]"):
        ClusterSelectConfig(stratify_column="task", strategy_kwargs={"sharded": True})
    with pytest.raises(TypeError, match="sharded"):
        ClusterSelectConfig(strategy_kwargs={"sharded": "yes"})
    assert ClusterSelectConfig(strategy_kwargs={"sharded": True}).cluster_settings.sharded is True


def test_a_third_kmeans_level_above_max_branch_squared(monkeypatch, two_level_calls):
    """With `MAX_BRANCH` lowered to 4, K = 225 > 4² takes the three-level path (∛K coarse groups, each split again
    by `two_level_kmeans`): the budget is still exact and the clusters still homogeneous."""
    from hf_cluster_select.selection import sampled

    monkeypatch.setattr(sampled, "MAX_BRANCH", 4)
    data, selection = _one_process("plain")
    calls = [k for depth, k in two_level_calls if depth == 0]  # the sharded third level, not its own recursion
    assert len(calls) == 7 and sum(calls) == 225  # ceil(∛225) = 7 coarse groups, their shares of K
    assert selection.n_kept == 900 and selection.weights.sum() == pytest.approx(3000.0)
    assert homogeneity_score(data["truth"][selection.indices], selection.labels) > 0.99


@pytest.mark.parametrize("path", ["select_subset", "select_sharded"])
def test_a_non_finite_loss_counts_as_the_hardest(path):
    """An example whose warm-up loss is NaN or inf is filled with the highest finite loss (one process and sharded
    alike), so `drop_hard_random` drops it first, as the hardest; it used to become 0, the easiest, and be kept."""
    from hf_cluster_select.selection import cluster_features, select_subset

    rng = np.random.default_rng(0)
    x = np.repeat(np.eye(4, 8, dtype=np.float32), 25, axis=0) + rng.normal(0, 0.01, (100, 8)).astype(np.float32)
    losses = np.linspace(0.1, 1.0, 100)
    broken = [3, 30, 55, 80]  # one per cluster
    losses[broken] = [np.nan, np.inf, -np.inf, np.nan]
    config = ClusterSelectConfig(data_fraction=0.5, within_cluster="drop_hard_random",
                                 strategy_kwargs={"drop_hardest": 0.2, "pca_dim": None, "kept_per_cluster": 25})
    if path == "select_subset":
        chosen = select_subset(cluster_features(x, config), config, losses=losses)
    else:
        chosen = select_sharded(x, np.arange(100), 100, config, losses=losses)
    assert chosen.n_kept == 50 and not np.isin(broken, chosen.indices).any()
