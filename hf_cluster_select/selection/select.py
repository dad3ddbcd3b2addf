"""Exact-budget selection of representative examples from clusters (layer L2: pure functions over arrays).

The budget (`budget.selection_budget`) is split over clusters (`quotas.cluster_quotas`); in each cluster a
within-cluster rule (`within_cluster.WITHIN_CLUSTER_RULES`: farthest from or nearest to the centroid, random, ...)
chooses the kept members and their weights, which sum to the cluster's size so that the weighted kept set stands for
the full data. CluSTER (Kim et al., EMNLP 2026) keeps peripheral members — they
beat random and central members in its ablation — with the same count per cluster; unlike CluSTER, the budget here
is met exactly.

Details of `select_from_labels`:
- *Deferred* examples (no loss-bearing token: training on them changes nothing) are kept only when the budget cannot
  be met without them: the others are selected with the same budget, clusters sized over them; when the budget
  reaches their count, all of them and the lowest-index deferred examples fill it, each weighted n / budget.
- *Duplicate groups* (`ClusteringResult.groups`: identical features, and with `near_duplicate_threshold` near
  copies of the same tokens, `near_duplicates.py`): each group is one candidate (its lowest-index copy): quotas count
  groups, and with `duplicate_weight="group"` a kept copy's weight is multiplied by its group's size, so a row
  repeated 15 times takes one slot and keeps its share of the weight; with `"one"` the group weighs as one example
  (the copies' mass is dropped, all weights rescaled to sum to n). Ignored when there are fewer groups than the
  budget.
- *Strata* (a user's task / source / language column): quotas and rules work on (stratum, cluster) cells, the
  budget split over strata first, so every stratum gets its proportional share; `Selection.labels` stay clusters.
- `budget_unit="tokens"`: the budget is `selection_budget(Σ lengths, data_fraction)` tokens, split over clusters
  (and strata) by their tokens; each cluster keeps the member count (at least 1) whose tokens, as its rule picks
  them, come closest to its share (bisection over the count, `_closest_count`): within one member for a rule whose
  choice grows with the count (facility location, k-center, central, peripheral), about so for rules that draw
  afresh for every count (random, importance sampling). The kept count varies.
- When the budget is below the number of clusters, the clusters left out are spread over the kept ones by scaling
  all weights by n / Σ|C_c| over the kept clusters.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from .._types import NO_LOSS_LABEL, ClusteringResult, Selection
from ..clock import timed
from ..config import BUDGET_UNITS, ClusterSelectConfig
from ..settings import SelectionSettings, check_choice, choices_of
from .budget import selection_budget
from .quotas import cluster_quotas
from .within_cluster import WITHIN_CLUSTER_RULES, checked_rule_settings, rule_settings_of


def _per_example(name: str, values: Any, n_total: int) -> np.ndarray:
    """`values` as a finite float64 `[n_total]` array: a non-finite loss becomes the highest finite one (an example
    whose loss overflowed is among the hardest, never the easiest), a non-finite norm 0 (no finite value: 0)."""
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.shape != (n_total,):
        raise ValueError(f"`{name}` must have shape [{n_total}], got {tuple(array.shape)}.")
    finite = np.isfinite(array)
    return np.where(finite, array, array[finite].max() if name == "losses" and finite.any() else 0.0)


def _cells(labels: np.ndarray, strata: Any, n_total: int) -> tuple[np.ndarray, np.ndarray]:
    """One id per (stratum, cluster) pair `[n_total]`, and the stratum of every cell id `[n_cells]`."""
    strata = np.asarray(strata).reshape(-1)
    if strata.shape != (n_total,):
        raise ValueError(f"`strata` must have shape [{n_total}], got {tuple(strata.shape)}.")
    strata = np.unique(strata, return_inverse=True)[1].reshape(-1)
    pairs, cells = np.unique(np.stack([strata, labels]), axis=1, return_inverse=True)
    return cells.reshape(-1), pairs[0]


def _units(eligible: np.ndarray, groups: Any, budget: int, n_total: int, cost: np.ndarray,
           duplicate_weight: str) -> tuple[np.ndarray, np.ndarray]:
    """The examples selection chooses among and how many examples each stands for: with `groups`, the first
    (lowest-index) eligible copy of every duplicate group, counting its copies (`duplicate_weight="group"`) or itself
    (`"one"`), as long as those copies' `cost` (1 per example, or its tokens) reaches `budget`; otherwise every
    eligible example once."""
    if groups is None:
        return eligible, np.ones(eligible.size, dtype=np.int64)
    groups = np.asarray(groups).reshape(-1)
    if groups.shape != (n_total,):
        raise ValueError(f"`groups` must have shape [{n_total}], got {tuple(groups.shape)}.")
    _, first, counts = np.unique(groups[eligible], return_index=True, return_counts=True)
    if cost[eligible[first]].sum() < budget:
        return eligible, np.ones(eligible.size, dtype=np.int64)
    order = np.argsort(first)
    copies = counts[order] if duplicate_weight == "group" else np.ones(order.size)
    return eligible[first[order]], copies.astype(np.int64)


def _closest_count(pick, tokens_of, target: int, available: int) -> tuple[np.ndarray, np.ndarray]:
    """`pick(count)` for the count in `[1, available]` whose chosen members hold the tokens closest to `target`:
    bisection for the smallest count reaching `target` (exact when the rule's choice grows with the count, as
    greedy medoids, k-center and distance ranks do), then that count or the one below, whichever is closer;
    about `log2(available) + 1` calls of `pick`."""
    picks: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def held(count: int) -> int:
        if count not in picks:
            chosen, weights = pick(count)
            picks[count] = (chosen, weights, tokens_of(chosen))
        return picks[count][2]

    low, high = 1, available
    while low < high:
        middle = (low + high) // 2
        if held(middle) < target:
            low = middle + 1
        else:
            high = middle
    candidates = [c for c in (low - 1, low) if c >= 1]
    best = min(candidates, key=lambda c: (abs(held(c) - target), c))
    return picks[best][0], picks[best][1]


def _checked(positions: Any, weights: Any, n_members: int, keep: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A rule's output, checked against the contract of `within_cluster.py`."""
    positions = np.asarray(positions).reshape(-1)
    weights = np.asarray(weights, dtype=np.float64).reshape(-1)
    if (positions.shape != (keep,) or not np.issubdtype(positions.dtype, np.integer)
            or np.unique(positions).size != keep or positions.min() < 0 or positions.max() >= n_members):
        raise ValueError(f"within-cluster rule {name!r} must return {keep} unique positions in [0, {n_members}), "
                         f"got {positions.tolist()[:10]}{'...' if positions.size > 10 else ''}.")
    if weights.shape != (keep,) or not np.isfinite(weights).all() or (weights <= 0).any() or not np.isclose(
            weights.sum(), n_members, rtol=1e-6):
        raise ValueError(f"within-cluster rule {name!r} must return {keep} finite positive weights summing to the "
                         f"cluster size {n_members}, got sum {weights.sum():.6g}.")
    return positions.astype(np.int64), weights


def select_from_labels(
    labels: Any,
    reduced: Any = None,
    *,
    data_fraction: float,
    within_cluster: str = ClusterSelectConfig.within_cluster,
    quota: str = SelectionSettings.quota,
    seed: int = ClusterSelectConfig.selection_seed,
    deferred: Any = None,
    norms: Any = None,
    losses: Any = None,
    groups: Any = None,
    strata: Any = None,
    lengths: Any = None,
    budget_unit: str = ClusterSelectConfig.budget_unit,
    duplicate_weight: str = "auto",
    rule_settings: dict[str, Any] | None = None,
) -> Selection:
    """Keep exactly `selection_budget(n, data_fraction)` examples (or about that share of the tokens), spread over
    clusters and weighted.

    Args:
        labels (array-like of shape `[n_examples]`, int): cluster of every example, >= 0 (resolve noise first).
        reduced (array-like of shape `[n_examples, dim]`, *optional*): the space the clusters live in; distances to
            each cluster's centroid (mean of its members, Euclidean) rank members. Required unless
            `within_cluster="random"`.
        data_fraction (`float`): share of examples to keep, in (0, 1]; the budget is rounded half up.
        within_cluster (`str`, *optional*, defaults to `ClusterSelectConfig.within_cluster`): a rule of
            `WITHIN_CLUSTER_RULES`, e.g. greedy medoids (`"facility_location"`), the members farthest from
            (`"peripheral"`, CluSTER's choice) or nearest to (`"central"`) the centroid, ties to the lower index,
            or a random subset seeded by (`seed`, cluster label) (`"random"`).
        quota (`str`, *optional*, defaults to `SelectionSettings.quota`): budget split, see `cluster_quotas`.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the rule's RNG.
        deferred (array-like of shape `[n_examples]`, bool, *optional*): examples kept only when the budget needs
            them (see the module docstring).
        norms, losses (array-like of shape `[n_examples]`, *optional*): raw feature norms (the gradient-norm
            estimate; NaN/inf → 0) and warm-up losses (NaN/inf → the highest finite), passed to the rule.
        groups (array-like of shape `[n_examples]`, int, *optional*): duplicate groups (`ClusteringResult.groups`).
        duplicate_weight (`str`, *optional*, defaults to `"auto"`): what a group's kept copy stands for, `"group"`
            (all its copies) or `"one"` (itself; see the module docstring); `"auto"` = `"group"` here (features
            without a model: `settings.resolve_duplicates`; the trainer resolves it per model before this).
        strata (array-like of shape `[n_examples]`, *optional*): a user's grouping (task, source, language).
        lengths (array-like of shape `[n_examples]`, int >= 1, *optional*): tokens of every example; required for
            `budget_unit="tokens"`.
        budget_unit (`str`, *optional*, defaults to `ClusterSelectConfig.budget_unit`): `"examples"` or `"tokens"`.
        rule_settings (`dict`, *optional*): keyword arguments of the within-cluster rule, its own settings
            (`within_cluster.rule_settings_of(config)`: e.g. `{"loss_outlier_z": 2.0}` for `"drop_loss_outliers"`).
    Returns:
        `Selection`: kept `indices` `[m]` (int64, sorted ascending), `weights` `[m]` (float64, `|C_c| / kept_c`,
        summing to n), `labels` `[m]` of the kept examples, `n_total` = n, and `stage_seconds` (wall-clock seconds
        of `inputs` (checking and converting the arguments), `units`, `quotas`, `within_cluster` and `weights`;
        only `inputs` when the budget keeps every eligible example).
    Raises:
        ValueError: if `labels` is not 1-D, empty or negative, `reduced` is missing, misshapen or not finite, an
            option is out of range, or `rule_settings` has a key the rule does not take.
        TypeError: if `seed` is not an int, `data_fraction` not a number or `rule_settings` not a dict.
    """
    stages: dict[str, float] = {}
    began = time.perf_counter()
    labels = _checked_labels(labels)
    rule = WITHIN_CLUSTER_RULES.get(within_cluster)
    rule_settings = checked_rule_settings(within_cluster, rule, rule_settings)
    check_choice("duplicate_weight", duplicate_weight, choices_of(SelectionSettings, "duplicate_weight"))
    duplicate_weight = "group" if duplicate_weight == "auto" else duplicate_weight
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"`seed` must be an int, got {seed!r}.")
    n_total = labels.size
    points = _checked_points(reduced, n_total, within_cluster, getattr(rule, "needs_points", True))
    norms, losses = (None if v is None else _per_example(name, v, n_total) for name, v in (("norms", norms),
                                                                                          ("losses", losses)))
    cost = _costs(budget_unit, lengths, n_total)
    budget = selection_budget(int(cost.sum()), data_fraction)
    eligible = _eligible(deferred, n_total)
    stages["inputs"] = time.perf_counter() - began
    if budget >= cost[eligible].sum():
        return _keep_all_eligible(labels, eligible, cost, budget, stages)
    with timed(stages, "units"):
        cells, stratum_of = (labels, None) if strata is None else _cells(labels, strata, n_total)
        units, copies = _units(eligible, groups, budget, n_total, cost, duplicate_weight)
        clusters, position = np.unique(cells[units], return_inverse=True)
        position = position.reshape(-1)
    with timed(stages, "quotas"):
        unit_sizes = np.bincount(position, weights=cost[units]).astype(np.int64)  # what quotas split: units/tokens
        sizes = np.bincount(position, weights=copies).astype(np.int64)  # examples
        quotas = _quotas(unit_sizes, budget, quota, None if stratum_of is None else stratum_of[clusters])
    with timed(stages, "within_cluster"):
        pick_for = functools.partial(_member_picker, rule, within_cluster, seed, points=points, norms=norms,
                                     losses=losses, rule_settings=rule_settings)
        indices, weights = _select_in_cells(position, units, copies, clusters, sizes, quotas, pick_for,
                                            cost if budget_unit == "tokens" else None)
    with timed(stages, "weights"):
        covered = int(sizes[quotas > 0].sum())
        if covered < n_total:  # clusters (budget < K), deferred examples or (`"one"`) copies left out: sum to n
            weights *= n_total / covered
        order = np.argsort(indices, kind="stable")
        indices = indices[order].astype(np.int64)
    return Selection(indices=indices, weights=weights[order], labels=labels[indices], n_total=int(n_total),
                     stage_seconds=stages)


def _keep_all_eligible(labels: np.ndarray, eligible: np.ndarray, cost: np.ndarray, budget: int,
                       stages: dict[str, float]) -> Selection:
    """Every eligible example, the rest of the budget filled with deferred ones by index, each weighted n / kept."""
    n_total = labels.size
    rest = np.setdiff1d(np.arange(n_total), eligible)
    fill = rest[np.cumsum(cost[rest]) <= budget - cost[eligible].sum()]
    indices = np.sort(np.concatenate([eligible, fill])).astype(np.int64)
    weights = np.full(indices.size, n_total / indices.size, dtype=np.float64)
    return Selection(indices=indices, weights=weights, labels=labels[indices], n_total=int(n_total),
                     stage_seconds=stages)


def _checked_labels(labels: Any) -> np.ndarray:
    """`labels` as int64 `[n]`, checked: 1-D, non-empty, integral, >= 0."""
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
    return labels


def _checked_points(reduced: Any, n_total: int, within_cluster: str, needed: bool) -> np.ndarray | None:
    """`reduced` as finite float64 `[n, d]`, or `None` when the rule needs no geometry and none was given."""
    if not needed and reduced is None:
        return None
    if reduced is None:
        raise ValueError(f"`reduced` is required for within_cluster={within_cluster!r}.")
    points = np.asarray(reduced, dtype=np.float64)
    if points.ndim == 1:
        points = points[:, None]
    if points.ndim != 2 or points.shape[0] != n_total:
        raise ValueError(f"`reduced` must have shape [{n_total}, dim], got {tuple(points.shape)}.")
    if not np.isfinite(points).all():
        raise ValueError(f"`reduced` holds {int((~np.isfinite(points)).sum())} NaN/inf values.")
    return points


def _costs(budget_unit: str, lengths: Any, n_total: int) -> np.ndarray:
    """What the budget counts per example `[n]`: 1 (`"examples"`) or its tokens (`"tokens"`)."""
    if budget_unit not in BUDGET_UNITS:
        raise ValueError(f"`budget_unit` must be one of {list(BUDGET_UNITS)}, got {budget_unit!r}.")
    if budget_unit == "examples":
        return np.ones(n_total, dtype=np.int64)
    if lengths is None:
        raise ValueError("`lengths` (tokens per example) is required for budget_unit='tokens'.")
    cost = np.asarray(lengths).reshape(-1).astype(np.int64)
    if cost.shape != (n_total,) or cost.min() < 1:
        raise ValueError(f"`lengths` must be {n_total} ints >= 1, got shape {cost.shape}, min {cost.min()}.")
    return cost


def _eligible(deferred: Any, n_total: int) -> np.ndarray:
    """Positions selection chooses among first: all but the `deferred` ones (all when every one is deferred)."""
    if deferred is None:
        return np.arange(n_total)
    deferred = np.asarray(deferred, dtype=bool).reshape(-1)
    if deferred.shape != (n_total,):
        raise ValueError(f"`deferred` must have shape [{n_total}], got {tuple(deferred.shape)}.")
    return np.arange(n_total) if deferred.all() else np.flatnonzero(~deferred)


def _quotas(unit_sizes: np.ndarray, budget: int, quota: str, owner: np.ndarray | None) -> np.ndarray:
    """Per-cell quotas `[n_cells]`; with strata (`owner`: the stratum of every cell), the budget goes over strata
    first (exact proportional shares), then each stratum's share over its cells."""
    if owner is None:
        return cluster_quotas(unit_sizes, budget, quota)
    present = np.unique(owner)
    per_stratum = cluster_quotas(np.bincount(owner, weights=unit_sizes).astype(np.int64)[present], budget,
                                 "proportional")
    quotas = np.zeros(unit_sizes.size, dtype=np.int64)
    for stratum, share in zip(present, per_stratum):
        if share:
            inside = owner == stratum
            quotas[inside] = cluster_quotas(unit_sizes[inside], int(share), quota)
    return quotas


def _select_in_cells(position: np.ndarray, units: np.ndarray, copies: np.ndarray, clusters: np.ndarray,
                     sizes: np.ndarray, quotas: np.ndarray, pick_for, token_cost: np.ndarray | None):
    """Every cell's kept members and their weights (summing to the cell's size in examples): `quotas` members by
    the cell's rule (`pick_for(cluster, members)`), or under a token budget (`token_cost` per example) the count
    whose tokens come closest to the quota. `position` `[n_units]` is every unit's cell (an index into `clusters`);
    the units are grouped by cell once (a stable sort: members stay in dataset order), not masked per cell, so the
    loop costs O(n log n) in all rather than O(n · n_cells). Returns (indices `[m]`, weights `[m]`), in cell
    order."""
    by_cell = np.argsort(position, kind="stable")
    ends = np.cumsum(np.bincount(position, minlength=clusters.size))
    starts = ends - np.bincount(position, minlength=clusters.size)
    kept_parts, weight_parts = [], []
    for cluster, size, keep, start, end in zip(clusters, sizes, quotas, starts, ends):
        if keep == 0:
            continue
        in_cluster = by_cell[start:end]
        members, counts = units[in_cluster], copies[in_cluster]
        pick = pick_for(int(cluster), members)
        if token_cost is None:
            positions, weights = pick(int(keep))
        else:  # `keep` tokens: the count whose members hold the tokens closest to it, by bisection over the count
            positions, weights = _closest_count(pick, lambda chosen: int(token_cost[members[chosen]].sum()),
                                                int(keep), members.size)
        weights = weights * counts[positions]  # a kept copy stands for its duplicates too
        kept_parts.append(members[positions])
        weight_parts.append(weights * (size / weights.sum()))
    return np.concatenate(kept_parts), np.concatenate(weight_parts)


def _member_picker(rule, within_cluster: str, seed: int, cluster: int, members: np.ndarray, *,
                   points: np.ndarray | None, norms: np.ndarray | None, losses: np.ndarray | None,
                   rule_settings: dict[str, Any] | None = None):
    """`pick(count) -> (positions, weights)`: the rule's choice of `count` of one cluster's `members`, checked;
    its RNG is seeded by (`seed`, `cluster`); `rule_settings` are passed to the rule as keyword arguments."""

    def pick(count: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([int(seed) % 2**64, int(cluster) % 2**64])
        chosen, weights = rule(np.zeros((members.size, 0)) if points is None else points[members], count, rng,
                               norms=None if norms is None else norms[members],
                               losses=None if losses is None else losses[members], **(rule_settings or {}))
        return _checked(chosen, weights, members.size, count, within_cluster)

    return pick


def select_subset(result: ClusteringResult, config: ClusterSelectConfig, *, norms: Any = None,
                  losses: Any = None, strata: Any = None, lengths: Any = None, suspected: Any = None) -> Selection:
    """Select from a clustering with the settings of `config` (`data_fraction`, `within_cluster` and its
    `quota` and `duplicate_weight`, `selection_seed`, `budget_unit`). Without a model, `duplicate_weight="auto"`
    is `"group"` (`settings.resolve_duplicates`; the trainer resolves it per model first).

    Args:
        result (`ClusteringResult`): output of `clustering.cluster_features` (`labels` `[n]`, `reduced` `[n, d]`).
        config (`ClusterSelectConfig`): selection settings.
        norms, losses (array-like of shape `[n_examples]`, *optional*): raw feature norms and warm-up losses
            (`FeatureOutput.norms` / `.losses`), for the rules that use them.
        strata (array-like of shape `[n_examples]`, *optional*): the values of `config.stratify_column`.
        lengths (array-like of shape `[n_examples]`, int, *optional*): tokens per example; required when
            `config.budget_unit="tokens"`.
        suspected (array-like of shape `[n_examples]`, bool, *optional*): suspected label/reply noise
            (`noise_filter.suspected_noise`), deferred too.
    Examples without loss-bearing tokens (raw label `NO_LOSS_LABEL`) are `deferred`: kept only when the budget
    cannot be met without them.

    Returns:
        `Selection`: see `select_from_labels`.
    Raises:
        ValueError: see `select_from_labels`.
    """
    if not isinstance(result, ClusteringResult):
        raise TypeError(f"`result` must be a ClusteringResult (cluster_features), got {type(result).__name__}.")
    if not isinstance(config, ClusterSelectConfig):
        raise TypeError(f"`config` must be a ClusterSelectConfig, got {type(config).__name__}.")
    deferred = (np.asarray(result.raw_labels) == NO_LOSS_LABEL) | (False if suspected is None
                                                                   else np.asarray(suspected, dtype=bool))
    return select_from_labels(
        result.labels, result.reduced, data_fraction=config.data_fraction, within_cluster=config.within_cluster,
        quota=config.selection_settings.quota, seed=config.selection_seed, deferred=deferred, norms=norms,
        losses=losses, groups=result.groups, strata=strata, lengths=lengths, budget_unit=config.budget_unit,
        duplicate_weight=config.selection_settings.duplicate_weight, rule_settings=rule_settings_of(config))
