"""Strategy registries: the names `ClusterSelectConfig` accepts are exactly the registered strategies."""

from __future__ import annotations

import numpy as np
import pytest

from hf_cluster_select import config as config_module
from hf_cluster_select.batching import ALLOCATIONS
from hf_cluster_select.features import FEATURES
from hf_cluster_select.registry import Registry
from hf_cluster_select.selection import CLUSTERERS, WITHIN_CLUSTER_RULES, select_from_labels


@pytest.mark.parametrize("registry, choices", [
    (FEATURES, config_module.FEATURES), (CLUSTERERS, config_module.CLUSTER_METHODS),
    (WITHIN_CLUSTER_RULES, config_module.WITHIN_CLUSTER), (ALLOCATIONS, config_module.ALLOCATIONS),
])
def test_config_choices_are_the_registered_names(registry, choices):
    assert registry.names() == list(choices)


def test_registry_errors_name_the_choices():
    registry: Registry = Registry("within_cluster")
    registry.register("a")(len)
    with pytest.raises(ValueError, match=r"`within_cluster` must be one of \['a'\], got 'b'"):
        registry.get("b")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(len)


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
