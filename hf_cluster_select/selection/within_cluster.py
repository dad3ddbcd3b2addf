"""Within-cluster rules: which members represent a cluster, and with what weights (layer L2).

A rule is a function

    rule(points [n_c, d], keep, rng, norms [n_c] or None, losses [n_c] or None) -> (positions [keep], weights [keep])

over the members of one cluster, in dataset order: `positions` are unique int64 indices into the members, `weights`
are positive float64 and sum to `n_c`, so that the kept members stand for the whole cluster. `norms` are the raw
(pre-normalisation) feature norms, `losses` the warm-up losses, where the pipeline has them. A rule that needs no
geometry sets `needs_points = False` and then gets `points` of shape `[n_c, 0]`. Register a rule with `@WITHIN_CLUSTER_RULES.register("name")`
(with `settings=` for a settings class of its own).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ..registry import WITHIN_CLUSTER_RULES
from ..settings import SelectionSettings

WithinClusterRule = Callable[..., tuple[np.ndarray, np.ndarray]]


def _uniform(positions: np.ndarray, n_members: int) -> tuple[np.ndarray, np.ndarray]:
    """`positions` as int64, each weighted `n_members / keep`."""
    positions = np.asarray(positions, dtype=np.int64)
    return positions, np.full(positions.size, n_members / positions.size, dtype=np.float64)


def _centroid_distances(points: np.ndarray) -> np.ndarray:
    """Euclidean distance of every row of `points` `[n_c, d]` to their mean."""
    return np.sqrt(((points - points.mean(axis=0)) ** 2).sum(axis=1))


@WITHIN_CLUSTER_RULES.register("peripheral")
def peripheral(points, keep, rng, norms=None, losses=None):
    """The `keep` members farthest from the centroid (ties: lower position), weight `n_c / keep` each.

    CluSTER's rule (Kim et al., EMNLP 2026): peripheral members beat random and central ones in its ablation.
    """
    order = np.lexsort((np.arange(points.shape[0]), -_centroid_distances(points)))
    return _uniform(order[:keep], points.shape[0])


@WITHIN_CLUSTER_RULES.register("central")
def central(points, keep, rng, norms=None, losses=None):
    """The `keep` members nearest to the centroid (ties: lower position), weight `n_c / keep` each."""
    order = np.lexsort((np.arange(points.shape[0]), _centroid_distances(points)))
    return _uniform(order[:keep], points.shape[0])


@WITHIN_CLUSTER_RULES.register("random")
def random(points, keep, rng, norms=None, losses=None):
    """A uniformly random `keep` of the members (`rng.permutation`), weight `n_c / keep` each: stratified random
    sampling with the clusters as strata."""
    return _uniform(rng.permutation(points.shape[0])[:keep], points.shape[0])


random.needs_points = False


def rule_settings_of(config: Any) -> dict[str, Any]:
    """The within-cluster rule's own settings, the keyword arguments it is called with: the fields of its settings
    class (registered with `settings=`) that the base `SelectionSettings` lacks, with their resolved values.

    Args:
        config (`ClusterSelectConfig`): the run's config; its `selection_settings` are read.
    """
    settings = config.selection_settings
    return {name: getattr(settings, name) for name in _own_fields(type(settings))}


def _own_fields(settings_class: type) -> list[str]:
    """The fields of a rule's settings class that the base `SelectionSettings` lacks, in declaration order."""
    shared = {f.name for f in dataclasses.fields(SelectionSettings)}
    return [f.name for f in dataclasses.fields(settings_class) if f.name not in shared]


def checked_rule_settings(name: str, rule: Any, settings: Any) -> dict[str, Any]:
    """`settings` (a within-cluster rule's keyword arguments, `rule_settings_of`) checked against the rule's
    signature before any selection work; `{}` for `None`.

    Args:
        name (`str`): the rule's registered name, for the message.
        rule (callable): the rule (`WITHIN_CLUSTER_RULES.get(name)`).
        settings (`dict[str, Any]` or `None`): the keyword arguments given.
    Raises:
        TypeError: if `settings` is not a dict with str keys.
        ValueError: if a key is not a keyword parameter of the rule (the rule's own ones are listed), or a value
            is refused by the rule's settings class (as `ClusterSelectConfig` refuses it; a parameter that is no
            field of a settings class is passed as given).
    """
    if settings is None:
        return {}
    if not isinstance(settings, dict) or not all(isinstance(key, str) for key in settings):
        raise TypeError(f"`rule_settings` must be a dict of keyword arguments, got {settings!r}.")
    parameters = inspect.signature(rule).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(settings)
    own = [p for p in parameters if p not in ("points", "keep", "rng", "norms", "losses")]
    unknown = sorted(set(settings) - set(own))
    if unknown:
        raise ValueError(f"`rule_settings` {unknown} are not settings of within_cluster={name!r}; it takes "
                         f"{own or 'none'}.")
    settings_class = WITHIN_CLUSTER_RULES.settings_class(name)
    fields = set(_own_fields(settings_class))
    checked = settings_class(**{key: value for key, value in settings.items() if key in fields})
    return {key: getattr(checked, key) if key in fields else value for key, value in settings.items()}
