"""Strategy registries: the names `ClusterSelectConfig` accepts are exactly the registered strategies."""

from __future__ import annotations

import numpy as np
import pytest

from dataclasses import dataclass

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.batching import ALLOCATIONS
from hf_cluster_select.features import FEATURES
from hf_cluster_select.registry import Registry
from hf_cluster_select.settings import SelectionSettings
from hf_cluster_select.selection import CLUSTERERS, WITHIN_CLUSTER_RULES, select_from_labels


@pytest.mark.parametrize("registry, field", [
    (FEATURES, "feature"), (CLUSTERERS, "cluster_method"), (WITHIN_CLUSTER_RULES, "within_cluster"),
    (ALLOCATIONS, "allocation"),
])
def test_config_accepts_exactly_the_registered_names(registry, field):
    """Every registered name is accepted by its config field, and a name nobody registered is refused with the list
    of registered ones (`feature="auto"` is the one name resolved per model instead, features/choice.py)."""
    assert registry.names() and "auto" not in registry.names()
    paper = {"allocation": "paper"}  # CluSTER's allocation needs CluSTER's clusterer
    for name in registry.names():
        values = ClusterSelectConfig.paper().to_dict() if (field, name) in paper.items() else {}
        values[field] = name
        assert getattr(ClusterSelectConfig.from_dict(values), field) == name
    with pytest.raises(ValueError, match=rf"`{field}` must be one of .*'{registry.names()[0]}'.*got 'nobody'"):
        ClusterSelectConfig(**{field: "nobody"})


@pytest.mark.parametrize("build", [lambda value: ClusterSelectConfig(feature=value),
                                   lambda value: ClusterSelectConfig.from_dict({"feature": value})])
def test_a_bad_feature_is_refused_with_auto_among_the_choices(build):
    """Built directly or from a dict (the command line's path), a bad `feature` lists `"auto"` first, then the
    registered signals; a value that is not a str gets the same message, not a hashing error."""
    for value, shown in (("nobody", "'nobody'"), (["badge"], r"\['badge'\]")):
        with pytest.raises(ValueError, match=rf"`feature` must be one of \['auto', 'last_layer_grad', .*got {shown}"):
            build(value)


def test_registry_errors_name_the_choices():
    registry: Registry = Registry("within_cluster", SelectionSettings, "hf_cluster_select.selection")
    registry._loaded = True  # no built-ins: an empty table
    registry.register("a")(len)
    with pytest.raises(ValueError, match=r"`within_cluster` must be one of \['a'\], got 'b'"):
        registry.get("b")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(len)
    with pytest.raises(TypeError, match="must be a dataclass"):
        registry.register("c", settings=dict)
    assert registry.settings_class("a") is SelectionSettings  # the stage's base when none is given


def test_a_user_strategy_brings_its_own_settings():
    """A rule registered with a settings class: `strategy_kwargs` takes its settings (validated by the class, with
    the stage's `quota` still there), `selection_settings` resolves them, and another rule refuses them."""

    @dataclass(frozen=True)
    class OffsetSettings(SelectionSettings):
        offset: int = 0

        def __post_init__(self):
            super().__post_init__()
            if self.offset < 0:
                raise ValueError(f"`offset` must be >= 0, got {self.offset}")

    WITHIN_CLUSTER_RULES.register("offset_for_test", settings=OffsetSettings)(lambda *a, **k: None)
    try:
        config = ClusterSelectConfig(within_cluster="offset_for_test", strategy_kwargs={"offset": 2, "quota": "uniform"})
        assert config.selection_settings == OffsetSettings(quota="uniform", offset=2)
        assert config.strategy_kwargs == {"offset": 2, "quota": "uniform"}
        assert ClusterSelectConfig.from_json(config.to_json()) == config
        with pytest.raises(ValueError, match="`strategy_kwargs`: `offset` must be >= 0, got -1"):
            ClusterSelectConfig(within_cluster="offset_for_test", strategy_kwargs={"offset": -1})
        with pytest.raises(ValueError, match=r"'offset' \(a setting of within_cluster='offset_for_test'\)"):
            ClusterSelectConfig(strategy_kwargs={"offset": 2})
    finally:
        del WITHIN_CLUSTER_RULES._entries["offset_for_test"], WITHIN_CLUSTER_RULES._settings["offset_for_test"]


def test_a_new_rule_is_one_function_and_one_line(monkeypatch):
    """A rule registered under a new name is used by selection (here: keep the lowest positions, weights n_c/keep)."""
    def lowest(points, keep, rng, norms=None, losses=None):
        return np.arange(keep), np.full(keep, points.shape[0] / keep)

    monkeypatch.setitem(WITHIN_CLUSTER_RULES._entries, "lowest", lowest)
    chosen = select_from_labels([0, 0, 0, 0, 1, 1], np.zeros((6, 1)), data_fraction=0.5, within_cluster="lowest")
    assert chosen.indices.tolist() == [0, 1, 4] and chosen.weights.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("name", WITHIN_CLUSTER_RULES.names())
def test_every_rule_keeps_exactly_and_weights_sum_to_the_cluster(name):
    rule = WITHIN_CLUSTER_RULES.get(name)
    points = np.random.default_rng(0).normal(size=(11, 3))
    positions, weights = rule(points, 4, np.random.default_rng(1))
    assert len(set(positions.tolist())) == 4 and all(0 <= p < 11 for p in positions)
    assert (weights > 0).all() and weights.sum() == pytest.approx(11)


def test_a_user_registered_rule_is_accepted_by_the_config():
    from hf_cluster_select.registry import WITHIN_CLUSTER_RULES as shared

    assert shared is WITHIN_CLUSTER_RULES  # one registry, importable without the stage modules

    @shared.register("first_k_for_test")
    def first_k(points, keep, rng, norms=None, losses=None):
        return np.arange(keep), np.full(keep, points.shape[0] / keep)

    try:
        config = ClusterSelectConfig(within_cluster="first_k_for_test", data_fraction=0.5)
        from hf_cluster_select.selection import cluster_features, select_subset

        features = np.r_[np.random.default_rng(0).normal(size=(10, 4)), 5 + np.random.default_rng(1).normal(size=(10, 4))]
        chosen = select_subset(cluster_features(features, ClusterSelectConfig(cluster_method="kmeans")), config)
        assert chosen.n_kept == 10 and chosen.weights.sum() == pytest.approx(20)
    finally:
        del shared._entries["first_k_for_test"], shared._settings["first_k_for_test"]
    with pytest.raises(ValueError, match="`within_cluster` must be one of"):
        ClusterSelectConfig(within_cluster="first_k_for_test")


@pytest.mark.parametrize("positions, weights, message", [
    (np.zeros(2, dtype=np.int64), np.full(2, 2.0), "unique positions"),
    (np.array([0, 9]), np.full(2, 2.0), r"unique positions in \[0, 4\)"),
    (np.array([0, 1]), np.ones(2), "summing to the cluster size 4"),
    (np.array([0, 1]), np.array([4.0, 0.0]), "finite positive weights"),
])
def test_a_faulty_rule_is_refused(monkeypatch, positions, weights, message):
    monkeypatch.setitem(WITHIN_CLUSTER_RULES._entries, "faulty", lambda *a, **k: (positions, weights))
    with pytest.raises(ValueError, match=message):
        select_from_labels([0, 0, 0, 0, 1, 1, 1, 1], np.zeros((8, 1)), data_fraction=0.5, within_cluster="faulty")


def test_registering_a_builtin_name_first_fails_at_once_and_leaves_the_registry_whole():
    """In a fresh process, a clash with a built-in name is refused at registration (the built-ins load first), and
    the built-in rules still work afterwards."""
    import subprocess
    import sys

    code = ("from hf_cluster_select.registry import TARGET_RULES\n"
            "try:\n"
            "    TARGET_RULES.register('top_k_cosine')(lambda *a, **k: None)\n"
            "except ValueError as error:\n"
            "    print('refused:', error)\n"
            "from hf_cluster_select.settings import TargetSettings\n"
            "print(TargetSettings(target_rule='relevant_sample').target_rule)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: target_rule strategy 'top_k_cosine' is already registered.",
                                        "relevant_sample"]


def test_a_user_rule_is_called_with_its_own_settings():
    """The registry docstring's `first_k` with `offset`: the setting given in `strategy_kwargs` reaches the rule."""
    from dataclasses import dataclass

    from hf_cluster_select.selection import cluster_features, select_subset
    from hf_cluster_select.settings import SelectionSettings

    @dataclass(frozen=True)
    class OffsetSettings(SelectionSettings):
        offset_for_test: int = 0

    seen = []

    @WITHIN_CLUSTER_RULES.register("offset_k_for_test", settings=OffsetSettings)
    def offset_k(points, keep, rng, norms=None, losses=None, offset_for_test=0):
        seen.append(offset_for_test)
        return np.arange(offset_for_test, offset_for_test + keep) % points.shape[0], np.full(keep, points.shape[0] / keep)

    try:
        angle = 0.05 * np.arange(6)
        features = np.r_[np.c_[np.cos(angle), np.sin(angle), 0 * angle], np.c_[0 * angle, np.cos(angle), np.sin(angle)]]
        result = cluster_features(features, ClusterSelectConfig(cluster_method="kmeans",
                                                                strategy_kwargs={"kmeans_n_clusters": 2}))
        config = ClusterSelectConfig(within_cluster="offset_k_for_test", data_fraction=0.5,
                                     strategy_kwargs={"offset_for_test": 5})
        chosen = select_subset(result, config)
        assert seen == [5, 5] and chosen.indices.tolist() == [0, 1, 5, 6, 7, 11]  # members 5, 0, 1 of each blob
        assert chosen.weights.tolist() == [2.0] * 6
    finally:
        del WITHIN_CLUSTER_RULES._entries["offset_k_for_test"], WITHIN_CLUSTER_RULES._settings["offset_k_for_test"]


def test_drop_loss_outliers_takes_its_threshold_from_strategy_kwargs():
    """Two clusters of 9 on arcs (features are L2-normalised). The first's losses 1.0 … 1.7 and 9.0 (median 1.4, MAD 0.2): z > 1 drops rows 7
    (z 1.01) and 8; the second's are all 1.0 (MAD 0: none dropped). A huge z drops none: plain facility location."""
    from hf_cluster_select.selection import cluster_features, select_subset

    angle = 0.05 * np.arange(9)
    features = np.r_[np.c_[np.cos(angle), np.sin(angle), 0 * angle], np.c_[0 * angle, np.cos(angle), np.sin(angle)]]
    losses = np.r_[1.0 + 0.1 * np.arange(8), 9.0, np.ones(9)]
    result = cluster_features(features, ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={
                                                            "kmeans_n_clusters": 2, "pca_dim": None}))
    pick = {z: select_subset(result, ClusterSelectConfig(
        within_cluster="drop_loss_outliers", data_fraction=6 / 18, strategy_kwargs={"loss_outlier_z": z}),
        losses=losses).indices.tolist() for z in (1.0, 1000.0)}
    plain = select_subset(result, ClusterSelectConfig(within_cluster="facility_location", data_fraction=6 / 18),
                          losses=losses).indices.tolist()
    assert pick[1000.0] == plain and len(pick[1.0]) == 6
    assert not {7, 8} & set(pick[1.0]) and {7, 8} & set(plain)  # the outliers were plain's picks, now dropped
    assert [i for i in pick[1.0] if i >= 9] == [i for i in plain if i >= 9]  # the flat cluster is unchanged
