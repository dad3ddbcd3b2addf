"""Tests of hf_cluster_select.selection with exact expected values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select._types import ClusteringResult
from hf_cluster_select.config import ClusterSelectConfig
from hf_cluster_select.selection import (
    cluster_quotas,
    select_from_labels,
    select_subset,
    selection_budget,
)

# Two clusters on a line: cluster 0 at 0, 1, 2, 10 (centroid 3.25), cluster 1 at 20..23 (centroid 21.5).
LINE_LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1])
LINE_POINTS = np.array([0.0, 1.0, 2.0, 10.0, 20.0, 21.0, 22.0, 23.0])[:, None]


@pytest.mark.parametrize(
    "n, fraction, expected",
    [
        (10, 0.35, 4),
        (10, 0.25, 3),
        (10, 0.24, 2),
        (10, 0.3, 3),
        (7, 0.5, 4),
        (100, 0.005, 1),
        (10, 0.001, 1),
        (3, 1.0, 3),
        (1, 0.3, 1),
        (640, 0.3, 192),
        (1001, 0.5, 501),
        (52002, 0.31, 16121),
    ],
)
def test_budget_rounds_half_up(n, fraction, expected):
    assert selection_budget(n, fraction) == expected


def test_budget_met_over_many_sizes():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 8, 13, 50, 101, 257):
        labels = rng.integers(0, 6, size=n)
        points = rng.normal(size=(n, 3))
        for fraction in (0.01, 0.1, 0.25, 0.3, 1 / 3, 0.5, 0.75, 0.99, 1.0):
            for quota in ("proportional", "uniform"):
                chosen = select_from_labels(labels, points, data_fraction=fraction, quota=quota)
                assert chosen.n_kept == selection_budget(n, fraction)
                assert chosen.n_total == n


@pytest.mark.parametrize(
    "sizes, budget, expected",
    [
        ([50, 30, 20], 10, [5, 3, 2]),
        ([10, 10, 10], 10, [4, 3, 3]),  # equal remainders: lower label first
        ([97, 1, 1, 1], 4, [1, 1, 1, 1]),
        ([97, 1, 1, 1], 10, [7, 1, 1, 1]),  # the small clusters are fixed at one, 7 left for the big one
        ([5, 3, 3], 2, [1, 1, 0]),  # budget < K: largest first, ties by label
        ([3, 5, 5], 2, [0, 1, 1]),
        ([4, 4], 8, [4, 4]),
    ],
)
def test_proportional_quotas(sizes, budget, expected):
    assert cluster_quotas(sizes, budget, "proportional").tolist() == expected


@pytest.mark.parametrize(
    "sizes, budget, expected",
    [
        ([2, 5, 10, 20], 20, [2, 5, 6, 7]),
        ([2, 5, 10, 20], 9, [2, 2, 2, 3]),
        ([10, 10, 10], 10, [4, 3, 3]),
        ([3, 3, 3], 2, [1, 1, 0]),
        ([1, 100], 50, [1, 49]),
        ([6, 6, 1], 13, [6, 6, 1]),
    ],
)
def test_uniform_quotas(sizes, budget, expected):
    assert cluster_quotas(sizes, budget, "uniform").tolist() == expected


def test_peripheral_and_central_exact():
    peripheral = select_from_labels(LINE_LABELS, LINE_POINTS, data_fraction=0.5, within_cluster="peripheral")
    assert peripheral.indices.tolist() == [0, 3, 4, 7]  # 4 and 7 tie at 1.5 from 21.5
    assert peripheral.labels.tolist() == [0, 0, 1, 1]
    assert peripheral.weights.tolist() == [2.0, 2.0, 2.0, 2.0]
    central = select_from_labels(LINE_LABELS, LINE_POINTS, data_fraction=0.5, within_cluster="central")
    assert central.indices.tolist() == [1, 2, 5, 6]
    single = select_from_labels(LINE_LABELS, LINE_POINTS, data_fraction=0.25, within_cluster="peripheral")
    assert single.indices.tolist() == [3, 4]  # tie between 4 and 7 → lower index
    central_one = select_from_labels(LINE_LABELS, LINE_POINTS.ravel(), data_fraction=0.25, within_cluster="central")
    assert central_one.indices.tolist() == [2, 5]


def test_weights_follow_cluster_sizes():
    labels = np.array([0] * 6 + [1] * 3 + [2])
    chosen = select_from_labels(labels, np.arange(10.0), data_fraction=0.5, within_cluster="peripheral")
    assert chosen.indices.tolist() == [0, 1, 5, 6, 9]  # quotas [3, 1, 1]; ties (0/5, 1/4, 6/8) → lower index
    assert chosen.weights.tolist() == [2.0, 2.0, 2.0, 3.0, 1.0]
    assert chosen.weights.sum() == 10.0
    assert np.allclose(chosen.loss_weights().mean(), 1.0)


def test_random_is_deterministic_and_seeded():
    labels = np.repeat(np.arange(4), 25)
    first = select_from_labels(labels, None, data_fraction=0.3, within_cluster="random", seed=1)
    again = select_from_labels(labels, None, data_fraction=0.3, within_cluster="random", seed=1)
    other = select_from_labels(labels, None, data_fraction=0.3, within_cluster="random", seed=2)
    assert np.array_equal(first.indices, again.indices)
    assert not np.array_equal(first.indices, other.indices)
    assert np.bincount(first.labels).tolist() == [8, 8, 7, 7]


def test_select_subset_uses_config():
    result = ClusteringResult(
        labels=LINE_LABELS,
        raw_labels=LINE_LABELS,
        reduced=LINE_POINTS.astype(np.float32),
        n_clusters=2,
        method="hdbscan",
    )
    chosen = select_subset(result, ClusterSelectConfig(data_fraction=0.5, within_cluster="central"))
    assert chosen.indices.tolist() == [1, 2, 5, 6]
    peripheral = ClusterSelectConfig(data_fraction=0.5, within_cluster="peripheral")
    assert select_subset(result, peripheral).indices.tolist() == [0, 3, 4, 7]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"labels": [0, -1, 1]}, "negative"),
        ({"labels": []}, "non-empty"),
        ({"labels": [[0, 1]]}, "1-D"),
        ({"labels": [0.5, 1.0]}, "integers"),
        ({"reduced": None}, "`reduced` is required"),
        ({"reduced": np.ones((2, 2))}, "shape"),
        ({"reduced": np.array([[np.nan], [0.0], [1.0]])}, "NaN"),
        ({"data_fraction": 0.0}, "data_fraction"),
        ({"data_fraction": 1.5}, "data_fraction"),
        ({"within_cluster": "edge"}, "within_cluster"),
        ({"quota": "equal"}, "quota"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    arguments = {"labels": [0, 1, 1], "reduced": np.zeros((3, 1)), "data_fraction": 0.5}
    arguments.update(kwargs)
    labels = arguments.pop("labels")
    reduced = arguments.pop("reduced")
    with pytest.raises(ValueError, match=message):
        select_from_labels(labels, reduced, **arguments)


def test_rejects_bad_types():
    with pytest.raises(TypeError, match="seed"):
        select_from_labels([0, 1], None, data_fraction=0.5, within_cluster="random", seed=1.5)
    with pytest.raises(TypeError, match="data_fraction"):
        select_from_labels([0, 1], None, data_fraction="half", within_cluster="random")


def test_rejects_bad_quota_inputs():
    with pytest.raises(ValueError, match="sizes"):
        cluster_quotas([3, 0], 2)
    with pytest.raises(ValueError, match="budget"):
        cluster_quotas([3, 2], 6)
    with pytest.raises(ValueError, match="n_total"):
        selection_budget(0, 0.5)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=8),
    fraction=st.floats(min_value=1e-3, max_value=1.0),
    within=st.sampled_from(["peripheral", "central", "random"]),
    quota=st.sampled_from(["proportional", "uniform"]),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_selection_invariants(sizes, fraction, within, quota, seed):
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    points = rng.normal(size=(labels.size, 3)).round(1)  # rounding creates distance ties
    n = labels.size
    chosen = select_from_labels(labels, points, data_fraction=fraction, within_cluster=within, quota=quota, seed=seed)
    budget = selection_budget(n, fraction)
    assert chosen.n_kept == budget
    assert chosen.indices.dtype == np.int64 and chosen.weights.dtype == np.float64
    assert np.all(np.diff(chosen.indices) > 0)  # sorted and unique
    assert chosen.indices.min() >= 0 and chosen.indices.max() < n
    assert np.array_equal(chosen.labels, labels[chosen.indices])
    assert np.isfinite(chosen.weights).all() and (chosen.weights > 0).all()
    assert abs(chosen.weights.sum() - n) < 1e-9
    kept_per_cluster = np.bincount(chosen.labels, minlength=len(sizes))
    if budget >= len(sizes):
        assert (kept_per_cluster >= 1).all()
    assert (kept_per_cluster <= np.array(sizes)).all()
    again = select_from_labels(labels, points, data_fraction=fraction, within_cluster=within, quota=quota, seed=seed)
    assert np.array_equal(chosen.indices, again.indices)


def test_weights_sum_to_n_when_budget_below_cluster_count():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 3)
    chosen = select_from_labels(labels, np.arange(11.0), data_fraction=0.2)  # budget 2 < K = 3
    assert chosen.labels.tolist() == [0, 1]
    assert chosen.weights.tolist() == [5 * 11 / 8, 3 * 11 / 8]
    assert chosen.weights.sum() == 11.0


def test_a_repeated_row_takes_one_slot_and_keeps_its_weight():
    """A row repeated 15 times among 60 distinct rows: clustering merges the copies into one group, selection keeps
    at most one copy, and with `duplicate_weight="group"` that copy's weight counts the 15 (issue: it used to take 4
    of 23 slots); with `"one"` it weighs as one example."""
    from hf_cluster_select import ClusterSelectConfig
    from hf_cluster_select.selection import cluster_features

    rng = np.random.default_rng(0)
    distinct = np.r_[rng.normal(size=(30, 8)), 4 + rng.normal(size=(30, 8))]
    features = np.r_[distinct, np.repeat(distinct[:1] * 3.0, 15, axis=0)]  # copies of row 0's direction
    result = cluster_features(features, ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={"kmeans_n_clusters": 2}))
    copies = [0, *range(60, 75)]
    assert np.unique(result.groups[copies]).size == 1 and np.unique(result.groups).size == 60
    for rule in ("peripheral", "central", "random", "kcenter", "importance_norm"):
        for weight in ("group", "one"):
            chosen = select_subset(result, ClusterSelectConfig(data_fraction=0.3, within_cluster=rule,
                                                               strategy_kwargs={"duplicate_weight": weight}),
                                   norms=np.linalg.norm(features, axis=1))
            kept = set(chosen.indices.tolist())
            assert chosen.n_kept == 23 and len(kept & set(copies)) <= 1, rule
            assert chosen.weights.sum() == pytest.approx(75)
            if kept & set(copies):
                mine = chosen.weights[chosen.indices.tolist().index(min(kept & set(copies)))]
                if weight == "group":
                    assert mine > 8 * np.median(chosen.weights), rule
                else:
                    assert mine < 2 * np.median(chosen.weights), rule


def test_groups_are_ignored_when_fewer_than_the_budget():
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    chosen = select_from_labels(np.zeros(8, dtype=int), within_cluster="random", data_fraction=0.5, groups=groups)
    assert chosen.n_kept == 4 and chosen.weights.tolist() == [2.0] * 4
    chosen = select_from_labels(np.zeros(8, dtype=int), within_cluster="random", data_fraction=0.25, groups=groups)
    assert sorted(chosen.indices.tolist()) == [0, 4] and chosen.weights.tolist() == [4.0, 4.0]


def test_duplicate_weight_group_counts_the_copies_and_one_drops_them():
    """Rows 0-2 are one group (one slot): `"group"` weighs its kept copy for 3 examples, `"one"` for 1, then rescales
    every weight to sum to n. One cluster: central keeps 0, 3, 4 (centroid of the units 0, 1, 2, 10 is 3.25); rule
    weights 4/3 each, × [3, 1, 1] and scaled to the 6 examples = [3.6, 1.2, 1.2], or (one) scaled 6 / 4 = 2 each."""
    points = np.array([0.0, 0.0, 0.0, 1.0, 2.0, 10.0])[:, None]
    expected = {"group": [3.6, 1.2, 1.2], "one": [2.0, 2.0, 2.0]}
    for weight, values in expected.items():
        chosen = select_from_labels(np.zeros(6, dtype=int), points, data_fraction=0.5, within_cluster="central",
                                    groups=[0, 0, 0, 1, 2, 3], duplicate_weight=weight)
        assert chosen.indices.tolist() == [0, 3, 4] and chosen.weights.tolist() == pytest.approx(values)
        assert chosen.weights.sum() == pytest.approx(6)
    # two clusters: quotas count units ([2, 4] → [1, 3]); "one" spreads the 2 dropped copies over all 8
    labels, groups = np.array([0, 0, 0, 0, 1, 1, 1, 1]), [0, 0, 0, 1, 2, 3, 4, 5]
    points = np.array([0.0, 0.0, 0.0, 10.0, 20.0, 21.0, 22.0, 30.0])[:, None]
    expected = {"group": [4.0, 4 / 3, 4 / 3, 4 / 3], "one": [8 / 3, 16 / 9, 16 / 9, 16 / 9]}
    for weight, values in expected.items():
        chosen = select_from_labels(labels, points, data_fraction=0.5, within_cluster="central", groups=groups,
                                    duplicate_weight=weight)
        assert chosen.indices.tolist() == [0, 4, 5, 6] and chosen.weights.tolist() == pytest.approx(values)
        assert chosen.weights.sum() == pytest.approx(8)
    default = select_from_labels(labels, points, data_fraction=0.5, within_cluster="central", groups=groups)
    assert default.weights.tolist() == pytest.approx(expected["group"])  # "auto" is "group" without a model
    auto = select_subset(ClusteringResult(labels=labels, raw_labels=labels, reduced=points, n_clusters=2,
                                          method="kmeans", groups=np.asarray(groups)),
                         ClusterSelectConfig(data_fraction=0.5, within_cluster="central"))
    assert auto.weights.tolist() == pytest.approx(expected["group"])
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=points, n_clusters=2, method="kmeans",
                              groups=np.asarray(groups))
    one = select_subset(result, ClusterSelectConfig(data_fraction=0.5, within_cluster="central",
                                                    strategy_kwargs={"duplicate_weight": "one"}))
    assert one.weights.tolist() == pytest.approx(expected["one"])
    with pytest.raises(ValueError, match=r"`duplicate_weight` must be one of \['auto', 'group', 'one'\], got 'all'"):
        select_from_labels(labels, points, data_fraction=0.5, groups=groups, duplicate_weight="all")


def test_facility_location_picks_the_medoids_of_two_groups():
    """Points 0 1 2 | 10 11 12: the first greedy pick maximises Σ (12 − distance), a tie between 2 and 10 (total
    distance 30) that goes to the lower position; the second adds 11 (gain 25, against 24 for 10)."""
    from hf_cluster_select.selection import WITHIN_CLUSTER_RULES

    points = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0]])
    positions, weights = WITHIN_CLUSTER_RULES.get("facility_location")(points, 2, np.random.default_rng(0))
    assert positions.tolist() == [2, 4] and weights.tolist() == [3.0, 3.0]
    positions, weights = WITHIN_CLUSTER_RULES.get("craig")(points, 3, np.random.default_rng(0))
    assert sorted(weights.tolist()) == [1.0, 2.0, 3.0] and weights.sum() == 6.0  # members each medoid stands for


def test_fine_kmeans_cuts_each_blob_into_strata_of_the_budget():
    from hf_cluster_select import ClusterSelectConfig
    from hf_cluster_select.selection import cluster_features

    rng = np.random.default_rng(0)
    centres = np.array([[20.0, 0, 0], [0, 20.0, 0], [0, 0, 20.0]])
    features = np.concatenate([c + rng.normal(size=(30, 3)) for c in centres])
    blob = np.repeat(np.arange(3), 30)
    config = ClusterSelectConfig(data_fraction=0.4, cluster_method="fine_kmeans", strategy_kwargs={"kept_per_cluster": 4})
    result = cluster_features(features, config)
    assert result.n_clusters == 9 and result.params["n_clusters_requested"] == 9  # ceil(36 kept / 4)
    assert all(len(set(blob[result.labels == c])) == 1 for c in range(9))  # no stratum spans two blobs
    chosen = select_subset(result, config)
    assert chosen.n_kept == 36 and np.bincount(blob[chosen.indices]).tolist() == [12, 12, 12]
    assert chosen.weights.sum() == pytest.approx(90)


def test_strata_get_their_proportional_share_inside_one_cluster():
    """One cluster, strata of 30 and 10 examples, 10 kept: 8 and 2 (largest remainder of 7.5 / 2.5, ties to the
    larger), whatever the rule; the selection's labels stay the clusters."""
    labels = np.zeros(40, dtype=int)
    strata = np.array(["a"] * 30 + ["b"] * 10)
    points = np.r_[np.zeros((30, 1)), np.ones((10, 1))]
    for rule in ("random", "facility_location", "peripheral"):
        chosen = select_from_labels(labels, points, data_fraction=0.25, within_cluster=rule, strata=strata)
        assert np.bincount((strata[chosen.indices] == "b").astype(int)).tolist() == [8, 2], rule
        assert chosen.labels.tolist() == [0] * 10 and chosen.weights.sum() == pytest.approx(40)


def test_drop_loss_outliers_drops_high_loss_members_then_takes_medoids():
    """Losses 1, 1.1, 0.9, 1.0, 5.0, 1.2: median 1.05, MAD 0.1, so 5.0 (z 26.6) and 1.2 (z 1.01) are outliers at
    z > 1; facility location over positions 0 1 2 3 (points 0 1 2 10) picks 1, then 3; each stands for 3 of 6."""
    from hf_cluster_select.selection import WITHIN_CLUSTER_RULES
    from hf_cluster_select.selection.signal_rules import loss_outlier_scores

    rule = WITHIN_CLUSTER_RULES.get("drop_loss_outliers")
    points = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0]])
    losses = np.array([1.0, 1.1, 0.9, 1.0, 5.0, 1.2])
    assert np.allclose(loss_outlier_scores(losses), 0.6745 * (losses - 1.05) / 0.1)
    positions, weights = rule(points, 2, np.random.default_rng(0), losses=losses)
    assert positions.tolist() == [1, 3] and weights.tolist() == [3.0, 3.0]
    positions, _ = rule(points, 5, np.random.default_rng(0), losses=losses)  # readmits the least outlying (1.2)
    assert sorted(positions.tolist()) == [0, 1, 2, 3, 5]
    positions, _ = rule(points, 2, np.random.default_rng(0))  # no losses: plain facility location
    assert positions.tolist() == [2, 4]
    assert not loss_outlier_scores(np.ones(4)).any()  # MAD 0: nothing is an outlier


def test_drop_loss_outliers_through_select_from_labels_keeps_the_budget_and_skips_noisy_rows():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 50)
    points = rng.normal(size=(200, 3))
    losses = rng.normal(1.0, 0.1, size=200)
    noisy = rng.choice(200, size=20, replace=False)
    losses[noisy] += 3.0
    chosen = select_from_labels(labels, points, data_fraction=0.3, within_cluster="drop_loss_outliers", seed=0,
                                losses=losses)
    assert chosen.n_kept == 60 and abs(chosen.weights.sum() - 200) < 1e-9
    assert not np.isin(chosen.indices, noisy).any()
    assert np.bincount(chosen.labels, minlength=4).tolist() == [15, 15, 15, 15]


def test_rule_settings_are_checked_against_the_rule_before_selecting():
    """A rule's own keyword arguments reach it (a lower `loss_outlier_z` drops more members: here every noisy row
    and more); a key the rule does not take, or settings that are not a dict, are named before any work."""
    rng = np.random.default_rng(0)
    labels, points = np.repeat(np.arange(2), 20), rng.normal(size=(40, 3))
    losses = np.r_[np.full(18, 1.0), 9.0, 9.0, np.full(18, 1.0), 9.0, 9.0] + rng.normal(0, 0.01, 40)
    chosen = select_from_labels(labels, points, data_fraction=0.5, within_cluster="drop_loss_outliers", seed=0,
                                losses=losses, rule_settings={"loss_outlier_z": 2.0})
    assert chosen.n_kept == 20 and not np.isin(chosen.indices, [18, 19, 38, 39]).any()
    with pytest.raises(ValueError, match=r"`rule_settings` \['z'\] are not settings of within_cluster="
                                         r"'drop_loss_outliers'; it takes \['loss_outlier_z'\]"):
        select_from_labels(labels, points, data_fraction=0.5, within_cluster="drop_loss_outliers",
                           rule_settings={"z": 2})
    with pytest.raises(ValueError, match=r"not settings of within_cluster='central'; it takes none"):
        select_from_labels(labels, points, data_fraction=0.5, within_cluster="central", rule_settings={"z": 2})
    with pytest.raises(TypeError, match="`rule_settings` must be a dict"):
        select_from_labels(labels, points, data_fraction=0.5, rule_settings=[("z", 2)])
    hardest_dropped = select_from_labels(labels, points, data_fraction=0.25, within_cluster="drop_hard_random",
                                         losses=np.arange(40.0), rule_settings={"drop_hardest": 0.5})
    assert np.isin(hardest_dropped.indices, np.r_[0:10, 20:30]).all()  # the 10 highest losses of each cluster out
    from hf_cluster_select.selection.signal_rules import drop_hard_random

    for share, n_c, dropped in ((0.07, 100, 7), (0.14, 50, 7), (np.float32(0.4), 50, 20), (0.41, 50, 21)):
        pool = {int(p) for s in range(200) for p in drop_hard_random(np.zeros((n_c, 2)), 2, np.random.default_rng(s),
                                                                   losses=np.arange(n_c, dtype=float),
                                                                   drop_hardest=float(share))[0]}
        assert max(pool) == n_c - dropped - 1  # losses 0..n_c-1: exactly the `dropped` highest left out
    for bad in (-1, float("nan"), "2"):  # values checked as ClusterSelectConfig checks them
        with pytest.raises(ValueError, match="`loss_outlier_z` must be a finite number > 0"):
            select_from_labels(labels, points, data_fraction=0.5, within_cluster="drop_loss_outliers", losses=losses,
                               rule_settings={"loss_outlier_z": bad})


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "2", None])
def test_loss_outlier_z_must_be_a_finite_positive_number(bad):
    from hf_cluster_select import ClusterSelectConfig

    with pytest.raises(ValueError, match="`loss_outlier_z` must be a finite number > 0"):
        ClusterSelectConfig(within_cluster="drop_loss_outliers", strategy_kwargs={"loss_outlier_z": bad})
    config = ClusterSelectConfig(within_cluster="drop_loss_outliers", strategy_kwargs={"loss_outlier_z": np.int64(2)})
    assert config.selection_settings.loss_outlier_z == 2.0


def test_the_rules_that_need_losses_say_so():
    """`uses_losses` marks the rules the pipeline warns about when a truncated feature pass keeps no losses."""
    from hf_cluster_select.selection import WITHIN_CLUSTER_RULES

    marked = {name for name in WITHIN_CLUSTER_RULES.names() if getattr(WITHIN_CLUSTER_RULES.get(name), "uses_losses", False)}
    assert marked == {"drop_loss_outliers", "drop_hard_random", "loss_stratified", "importance_loss"}
