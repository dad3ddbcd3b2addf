"""The clusterer interface and its registry (layer L2).

A clusterer partitions the distinct, L2-normalised, PCA-reduced feature rows that `clustering.cluster_features`
prepares. It is a function

    fit(reduced [n_unique, d] float64, counts [n_unique] int, inverse [n_examples] int, config, world_size) -> ClusterFit

where row `i` of the examples is distinct row `inverse[i]`, repeated `counts[j]` times. Register one with
`@CLUSTERERS.register("name", settings=...)`: its settings class (a `settings.ClusteringSettings` subclass) is
what `ClusterSelectConfig(strategy_kwargs=...)` accepts for it, and `config.cluster_settings` inside `fit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..registry import CLUSTERERS


@dataclass(frozen=True)
class ClusterFit:
    """What a clusterer returns.

    Attributes:
        labels (`np.ndarray` of shape `[n_examples]`, int): cluster of every example, >= 0 (any ints; they are made
            contiguous afterwards).
        raw_labels (`np.ndarray` of shape `[n_examples]` or `None`): the clusterer's own labels (-1 = noise), or
            `None` when they equal `labels`.
        fallback (`str` or `None`): why and how a degenerate result was repaired.
        params (`dict`): resolved parameters, reported as they are.
    """

    labels: np.ndarray
    raw_labels: np.ndarray | None
    fallback: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


__all__ = ["CLUSTERERS", "ClusterFit"]
