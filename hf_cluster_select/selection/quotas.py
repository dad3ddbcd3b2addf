"""Splitting the selection budget over clusters (layer L2: integer arithmetic over cluster sizes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..settings import SelectionSettings, choices_of


def _one_each_to_largest(sizes: np.ndarray, budget: int) -> np.ndarray:
    """1 to each of the `budget` largest clusters (ties: lower position first), 0 elsewhere."""
    order = np.lexsort((np.arange(sizes.size), -sizes))
    quotas = np.zeros(sizes.size, dtype=np.int64)
    quotas[order[:budget]] = 1
    return quotas


def cluster_quotas(sizes: Any, budget: int, quota: str = SelectionSettings.quota) -> np.ndarray:
    """Split `budget` kept examples over clusters of the given sizes.

    - `proportional`: largest-remainder (Hamilton) apportionment of `budget` by size with integer arithmetic;
      clusters whose exact share is below 1 get 1 and the rest is re-apportioned over the others; leftover seats
      go to the largest remainders, ties to the lower position.
    - `uniform`: water-filling — the same count t per cluster, capped at its size, with the last
      `budget − Σ min(size, t)` seats (+1 each) going to the largest clusters that still have room.

    In both, every cluster gets at least 1 when `budget` >= K, and no cluster more than its size. When `budget` < K
    the `budget` largest clusters get 1 each (ties: lower position first).

    Args:
        sizes (array-like of shape `[K]`, int): cluster sizes, each >= 1.
        budget (`int`): total to keep, in [1, sum(sizes)].
        quota (`str`, *optional*, defaults to `"proportional"`): `"proportional"` or `"uniform"`.
    Returns:
        `np.ndarray` of shape `[K]`, int64: per-cluster counts summing to `budget`.
    Raises:
        ValueError: if `sizes` is empty or holds a size < 1, `budget` is out of range, or `quota` is unknown.
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if sizes.size == 0 or (sizes < 1).any():
        raise ValueError(f"`sizes` must be a non-empty list of positive cluster sizes, got {sizes.tolist()}.")
    total = int(sizes.sum())
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or not 1 <= budget <= total:
        raise ValueError(f"`budget` must be an int in [1, {total}], got {budget!r}.")
    if quota not in choices_of(SelectionSettings, "quota"):
        raise ValueError(f"`quota` must be one of {list(choices_of(SelectionSettings, 'quota'))}, got {quota!r}.")
    n_clusters = sizes.size
    if budget < n_clusters:
        return _one_each_to_largest(sizes, budget)
    quotas = np.zeros(n_clusters, dtype=np.int64)
    if quota == "uniform":
        level = 0  # largest t with Σ min(size, t) <= budget
        for candidate in np.unique(sizes):  # the level lies between two consecutive sizes
            if np.minimum(sizes, candidate).sum() > budget:
                break
            level = int(candidate)
        below = np.minimum(sizes, level).sum()
        growing = int((sizes > level).sum())
        if growing:
            level += int((budget - below) // growing)
        quotas = np.minimum(sizes, level)
        leftover = budget - int(quotas.sum())
        room = np.flatnonzero(sizes > quotas)
        room = room[np.lexsort((room, -sizes[room]))]
        quotas[room[:leftover]] += 1
        return quotas
    free = np.ones(n_clusters, dtype=bool)
    remaining = budget
    while True:  # fix clusters whose exact share is below one at one
        share_numerator = remaining * sizes
        denominator = int(sizes[free].sum())
        small = free & (share_numerator < denominator)
        if not small.any():
            break
        quotas[small] = 1
        remaining -= int(small.sum())
        free &= ~small
    free_index = np.flatnonzero(free)
    numerators = remaining * sizes[free_index]
    quotas[free_index] = numerators // denominator
    leftover = remaining - int(quotas[free_index].sum())
    remainders = numerators % denominator
    winners = free_index[np.lexsort((free_index, -remainders))[:leftover]]
    quotas[winners] += 1
    return quotas
