"""Exact-budget selection of representative examples from clusters (layer L2: pure functions over arrays).

The budget is split over clusters (`quota`), each cluster keeps the members farthest from (`peripheral`), nearest to
(`central`) its centroid, or a seeded random subset, and every kept example is weighted by `|C_c| / kept_c` so that
the weighted kept set stands for the full data. CluSTER (Kim et al., EMNLP 2026) keeps peripheral members — they
beat random and central members in its ablation — with the same count per cluster; unlike CluSTER, the budget here
is met exactly.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from ._types import NO_LOSS_LABEL, ClusteringResult, Selection
from .config import QUOTAS, WITHIN_CLUSTER, ClusterSelectConfig


def selection_budget(n_total: int, data_fraction: float) -> int:
    """Number of examples to keep: `max(1, round_half_up(data_fraction · n_total))`.

    The product is rounded half up on the decimal value of `data_fraction` as written (`repr`), so `0.35 · 10` gives
    4 although the binary float product is 3.4999…; Python's `round` (half to even, binary) is not used.

    Args:
        n_total (`int`): number of examples to choose from, >= 1.
        data_fraction (`float`): share to keep, in (0, 1].
    Returns:
        `int`: the budget m, with 1 <= m <= n_total.
    Raises:
        ValueError: if `n_total` < 1 or `data_fraction` is outside (0, 1].
        TypeError: if `data_fraction` is not a number.
    """
    if isinstance(n_total, bool) or not isinstance(n_total, (int, np.integer)) or n_total < 1:
        raise ValueError(f"`n_total` must be an int >= 1, got {n_total!r}.")
    if isinstance(data_fraction, bool) or not isinstance(data_fraction, (int, float, np.floating)):
        raise TypeError(f"`data_fraction` must be a float in (0, 1], got {data_fraction!r}.")
    if not 0.0 < float(data_fraction) <= 1.0:
        raise ValueError(f"`data_fraction` must be in (0, 1], got {data_fraction!r}.")
    exact = Decimal(repr(float(data_fraction))) * int(n_total)
    return max(1, min(int(n_total), int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))))


def _one_each_to_largest(sizes: np.ndarray, budget: int) -> np.ndarray:
    """1 to each of the `budget` largest clusters (ties: lower position first), 0 elsewhere."""
    order = np.lexsort((np.arange(sizes.size), -sizes))
    quotas = np.zeros(sizes.size, dtype=np.int64)
    quotas[order[:budget]] = 1
    return quotas


def cluster_quotas(sizes: Any, budget: int, quota: str = "proportional") -> np.ndarray:
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
    if quota not in QUOTAS:
        raise ValueError(f"`quota` must be one of {list(QUOTAS)}, got {quota!r}.")
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


def _rank_members(members: np.ndarray, points: np.ndarray | None, how: str, seed: int, cluster: int) -> np.ndarray:
    """Members of one cluster in keep order (first = kept first)."""
    if how == "random":
        rng = np.random.default_rng([seed % 2**64, int(cluster) % 2**64])
        return members[rng.permutation(members.size)]
    centroid = points.mean(axis=0)
    distances = np.sqrt(((points - centroid) ** 2).sum(axis=1))
    primary = -distances if how == "peripheral" else distances
    return members[np.lexsort((members, primary))]


def select_from_labels(
    labels: Any,
    reduced: Any = None,
    *,
    data_fraction: float,
    within_cluster: str = "peripheral",
    quota: str = "proportional",
    seed: int = 42,
    deferred: Any = None,
) -> Selection:
    """Keep exactly `selection_budget(n, data_fraction)` examples, spread over clusters and weighted.

    Args:
        labels (array-like of shape `[n_examples]`, int): cluster of every example, >= 0 (resolve noise first).
        reduced (array-like of shape `[n_examples, dim]`, *optional*): the space the clusters live in; distances to
            each cluster's centroid (mean of its members, Euclidean) rank members. Required unless
            `within_cluster="random"`.
        data_fraction (`float`): share of examples to keep, in (0, 1]; the budget is rounded half up.
        within_cluster (`str`, *optional*, defaults to `"peripheral"`): keep the members farthest from
            (`"peripheral"`, CluSTER's choice) or nearest to (`"central"`) the centroid, ties to the lower index;
            or a random subset seeded by (`seed`, cluster label) (`"random"`).
        quota (`str`, *optional*, defaults to `"proportional"`): budget split, see `cluster_quotas`.
        seed (`int`, *optional*, defaults to `42`): seed of `"random"`.
        deferred (array-like of shape `[n_examples]`, bool, *optional*): examples to keep only when the budget cannot
            be met without them (examples without loss-bearing tokens: training on them changes nothing). The others
            are selected as above with the same budget, clusters sized over them; when the budget reaches their
            count, all of them and the lowest-index deferred examples fill it, each weighted n / budget. When
            every example is deferred, none is.
    Returns:
        `Selection`: kept `indices` `[m]` (int64, sorted ascending), `weights` `[m]` (float64,
        `|C_c| / kept_c`, summing to n; when the budget is below the number of clusters, the clusters left out
        are spread over the kept ones by scaling all weights by n / Σ|C_c| over kept clusters), `labels` `[m]` of
        the kept examples, `n_total` = n.
    Raises:
        ValueError: if `labels` is not 1-D, empty or negative, `reduced` is missing, misshapen or not finite, or
            an option is out of range.
        TypeError: if `seed` is not an int or `data_fraction` not a number.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"`labels` must be a non-empty 1-D array, got shape {labels.shape}.")
    is_integral = np.issubdtype(labels.dtype, np.integer) or (
        np.issubdtype(labels.dtype, np.floating) and np.array_equal(labels, np.round(labels))
    )
    if not is_integral:
        raise ValueError(f"`labels` must hold integers, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    if (labels < 0).any():
        raise ValueError(
            f"`labels` holds {int((labels < 0).sum())} negative values (HDBSCAN noise?); apply a noise policy first."
        )
    if within_cluster not in WITHIN_CLUSTER:
        raise ValueError(f"`within_cluster` must be one of {list(WITHIN_CLUSTER)}, got {within_cluster!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"`seed` must be an int, got {seed!r}.")
    n_total = labels.size
    points = None
    if within_cluster != "random":
        if reduced is None:
            raise ValueError(f"`reduced` is required for within_cluster={within_cluster!r}.")
        points = np.asarray(reduced, dtype=np.float64)
        if points.ndim == 1:
            points = points[:, None]
        if points.ndim != 2 or points.shape[0] != n_total:
            raise ValueError(f"`reduced` must have shape [{n_total}, dim], got {tuple(points.shape)}.")
        if not np.isfinite(points).all():
            raise ValueError(f"`reduced` holds {int((~np.isfinite(points)).sum())} NaN/inf values.")
    budget = selection_budget(n_total, data_fraction)
    eligible = np.arange(n_total)
    if deferred is not None:
        deferred = np.asarray(deferred, dtype=bool).reshape(-1)
        if deferred.shape != (n_total,):
            raise ValueError(f"`deferred` must have shape [{n_total}], got {tuple(deferred.shape)}.")
        if not deferred.all():
            eligible = np.flatnonzero(~deferred)
    if budget >= eligible.size:  # keep every eligible example, fill the rest with deferred ones by index
        fill = np.setdiff1d(np.arange(n_total), eligible)[: budget - eligible.size]
        indices = np.sort(np.concatenate([eligible, fill])).astype(np.int64)
        weights = np.full(budget, n_total / budget, dtype=np.float64)
        return Selection(indices=indices, weights=weights, labels=labels[indices], n_total=int(n_total))
    clusters, sizes = np.unique(labels[eligible], return_counts=True)
    quotas = cluster_quotas(sizes, budget, quota)
    kept_parts, weight_parts = [], []
    for cluster, size, keep in zip(clusters, sizes, quotas):
        if keep == 0:
            continue
        members = eligible[labels[eligible] == cluster]
        ranked = _rank_members(members, None if points is None else points[members], within_cluster, seed, cluster)
        kept_parts.append(ranked[:keep])
        weight_parts.append(np.full(int(keep), size / keep, dtype=np.float64))
    indices = np.concatenate(kept_parts)
    weights = np.concatenate(weight_parts)
    covered = int(sizes[quotas > 0].sum())
    if covered < n_total:  # clusters (budget < K) or deferred examples left out: spread their mass to sum to n
        weights *= n_total / covered
    order = np.argsort(indices, kind="stable")
    indices = indices[order].astype(np.int64)
    return Selection(indices=indices, weights=weights[order], labels=labels[indices], n_total=int(n_total))


def select_subset(result: ClusteringResult, config: ClusterSelectConfig) -> Selection:
    """Select from a clustering with the settings of `config` (`data_fraction`, `quota`, `within_cluster`, `seed`).

    Args:
        result (`ClusteringResult`): output of `clustering.cluster_features` (`labels` `[n]`, `reduced` `[n, d]`).
        config (`ClusterSelectConfig`): selection settings.
    Examples without loss-bearing tokens (raw label `NO_LOSS_LABEL`) are `deferred`: kept only when the budget
    cannot be met without them.

    Returns:
        `Selection`: see `select_from_labels`.
    Raises:
        ValueError: see `select_from_labels`.
    """
    return select_from_labels(
        result.labels,
        result.reduced,
        data_fraction=config.data_fraction,
        within_cluster=config.within_cluster,
        quota=config.quota,
        seed=config.seed,
        deferred=np.asarray(result.raw_labels) == NO_LOSS_LABEL,
    )
