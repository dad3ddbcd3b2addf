"""Targeted selection: keep the pool examples that teach what the target set shows (layer L2: pure functions).

A *target set* is a few to a few hundred examples of what the user will be evaluated on, in the training data's
format, optionally split into target tasks (`TargetSettings.target_column`). Its features come from the same model
and pooling as the pool's. Every pool example gets, per target task, its *relevance*: the largest cosine similarity
between its feature and the task's target features (RDS+, Ivison et al., arXiv 2503.01807, Sec. 3: max over the
query examples).

`select_targeted` then spends an exact budget of `selection_budget(n, data_fraction)` examples:

1. *Coverage floor* (`target_coverage` · budget, rounded): spread over the clusters in proportion to their size
   (`quotas.cluster_quotas`), the most relevant members of each; these stand for the pool.
2. *Target share* (the rest): split equally over the target tasks, which take turns (round-robin, RDS+ Sec. 3.2)
   picking their next not-yet-kept example in the order their target rule (`registry.TARGET_RULES`) ranks the pool:
   `top_k_cosine` (by relevance, RDS+), `relevant_sample` (a seeded random sample of the task's *relevant region*,
   see below) or `cluster_relevance` (clusters by the mean relevance of their members).

The relevant region of a task: the pool examples at least as close to it as its own target examples are to each
other, `relevance >= target_self_relevance(...)` (the 25th percentile, over the task's target examples, of their
largest cosine to another target example of the task), capped at twice the task's share of the budget and never
smaller than the share. `relevant_sample` keeps a random sample of the region (nearest first after it): the rows
nearest a handful of target examples are alike, and on `benchmarks/targeted.py` a sample of the region taught the
held-out rows of the task more than the nearest rows did.

Duplicate groups (`ClusteringResult.groups`) are one candidate each (their lowest-index copy), so a repeated row
takes one slot; examples without a loss-bearing token (`deferred`) are kept only when the budget needs them.

Weights (they sum to n, as every `Selection`'s): the target share carries the mass n · (1 − floor/budget), split
equally over the target tasks and, within a task, equally over its kept examples; the floor carries n · floor /
budget, split over its clusters by their size. So the weighted kept set stands for the target tasks in equal parts
(plus the floor's share of the pool), not for the pool; with one task and no floor every weight is n / budget and
the loss weights are all 1.

A target rule is a function `rule(scores [n_candidates], labels [n_candidates], rng, *, share, threshold) -> order
[n_candidates]` that ranks the candidates for one target task (`scores`: their relevance to it; `labels`: their
clusters; `share`: how many examples the task will take, int; `threshold`: its self-relevance, float, `inf` when
unknown); register one with `@TARGET_RULES.register("name")`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Selection
from ..config import ClusterSelectConfig
from ..registry import TARGET_RULES
from ..settings import TargetSettings
from .budget import selection_budget
from .quotas import cluster_quotas


def relevance_scores(pool: Any, target: Any, tasks: Any, chunk_rows: int = 4096) -> np.ndarray:
    """Relevance of every pool example to every target task: max cosine similarity over the task's target examples.

    Args:
        pool (array-like of shape `[n_examples, dim]`): pool features (any scale; rows are L2-normalised here).
        target (array-like of shape `[n_target, dim]`): target features from the same model and pooling.
        tasks (array-like of shape `[n_target]`, int): target task of every target row, `0..n_tasks-1`, each present.
        chunk_rows (`int`, *optional*, defaults to `4096`): pool rows per similarity block (memory: chunk × n_target).
    Returns:
        `np.ndarray` of shape `[n_examples, n_tasks]`, float32, in [-1, 1]; 0 for an all-zero or non-finite row.
    Raises:
        ValueError: for mismatched shapes, an empty target, tasks that are not integers `0..n_tasks-1` each
            present, or `chunk_rows` < 1.
    """
    pool, target = _unit_rows(pool, "pool"), _unit_rows(target, "target")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be an int >= 1, got {chunk_rows!r}.")
    if pool.shape[1] != target.shape[1]:
        raise ValueError(f"`target` must have shape [n_target, {pool.shape[1]}] (the pool's dim), got {target.shape}.")
    tasks, n_tasks = _task_ids(tasks, target.shape[0])
    scores = np.empty((pool.shape[0], n_tasks), dtype=np.float32)
    for start in range(0, pool.shape[0], chunk_rows):
        similarity = pool[start:start + chunk_rows] @ target.T  # [chunk, n_target]
        for task in range(n_tasks):
            scores[start:start + chunk_rows, task] = similarity[:, tasks == task].max(axis=1)
    return scores


def target_self_relevance(target: Any, tasks: Any, quantile: float = 0.25) -> np.ndarray:
    """How close each target task's examples are to each other: per task, the `quantile` over its target examples of
    their largest cosine similarity to another example of the same task (the relevant region's threshold).

    Args:
        target (array-like of shape `[n_target, dim]`): target features.
        tasks (array-like of shape `[n_target]`, int): task of every target row, `0..n_tasks-1`, each present.
        quantile (`float`, *optional*, defaults to `0.25`): the percentile / 100, in [0, 1].
    Returns:
        `np.ndarray` of shape `[n_tasks]`, float64; `inf` for a task with a single target example (no region: its
        rule keeps the nearest examples).
    Raises:
        ValueError: for a target that is not 2-D or empty, tasks that do not match its rows or are not
            `0..n_tasks-1` each present, or a quantile outside [0, 1].
    """
    target = _unit_rows(target, "target")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0.0 <= quantile <= 1.0:
        raise ValueError(f"`quantile` must be a number in [0, 1], got {quantile!r}.")
    tasks, n_tasks = _task_ids(tasks, target.shape[0])
    out = np.full(n_tasks, np.inf)
    for task in range(out.size):
        rows = target[tasks == task]
        if rows.shape[0] > 1:
            similarity = rows @ rows.T
            np.fill_diagonal(similarity, -np.inf)
            out[task] = float(np.quantile(similarity.max(axis=1), quantile))
    return out


def _task_ids(tasks: Any, n_target: int) -> tuple[np.ndarray, int]:
    """`tasks` as int64 `[n_target]` and the task count, checked: integers `0..n_tasks-1`, each present."""
    if n_target == 0:
        raise ValueError("`target` is empty: it needs at least one row per target task.")
    values = np.atleast_1d(np.asarray(tasks))
    if values.shape != (n_target,):
        raise ValueError(f"`tasks` must have shape [{n_target}] (one task id per target row), got "
                         f"{np.shape(tasks)}.")
    if values.dtype.kind not in "iu":
        raise ValueError(f"`tasks` must be integer task ids, got dtype {values.dtype}.")
    n_tasks = int(values.max()) + 1
    if values.min() < 0 or np.unique(values).size != n_tasks:
        raise ValueError(f"`tasks` must use every id in 0..{n_tasks - 1}, got {sorted(set(values.tolist()))[:10]}.")
    return values.astype(np.int64), n_tasks


def _unit_rows(values: Any, name: str) -> np.ndarray:
    """`values` `[n, d]` as float32 rows of unit L2 norm (non-finite or zero rows become 0)."""
    rows = np.asarray(values, dtype=np.float32)
    if rows.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D array [rows, dim], got shape {rows.shape}.")
    rows = np.where(np.isfinite(rows).all(axis=1, keepdims=True), rows, 0.0)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


@TARGET_RULES.register("cluster_relevance")
def cluster_relevance(scores: np.ndarray, labels: np.ndarray, rng: np.random.Generator, **_: Any) -> np.ndarray:
    """Clusters by the mean relevance of their members, most relevant first; within a cluster, members by relevance
    (ties: lower position). A cluster is the unit of relevance, so one stray example near a target point does not
    pull in its neighbourhood, and the kept examples cover the target's region rather than its nearest points."""
    clusters, position = np.unique(labels, return_inverse=True)
    mean = np.bincount(position, weights=scores) / np.bincount(position)
    return np.lexsort((np.arange(scores.size), -scores, -mean[position]))


@TARGET_RULES.register("top_k_cosine")
def top_k_cosine(scores: np.ndarray, labels: np.ndarray, rng: np.random.Generator, **_: Any) -> np.ndarray:
    """The candidates by relevance alone, highest first (ties: lower position): RDS+'s selection (Ivison et al.,
    arXiv 2503.01807), clusters ignored."""
    return np.lexsort((np.arange(scores.size), -scores))


REGION_CAP = 2  # the relevant region holds at most this many times the task's share


@TARGET_RULES.register("relevant_sample")
def relevant_sample(scores: np.ndarray, labels: np.ndarray, rng: np.random.Generator, *, share: int,
                    threshold: float) -> np.ndarray:
    """The task's relevant region (candidates with `scores >= threshold`, at most `REGION_CAP` · `share` of them,
    the most relevant) in a random order drawn from `rng`, then the rest by relevance. When the region is no larger
    than the share this is `top_k_cosine` (the share's nearest candidates)."""
    order = top_k_cosine(scores, labels, rng)
    size = min(REGION_CAP * int(share), int(np.count_nonzero(scores >= threshold)))
    if size <= share:
        return order
    return np.concatenate([rng.permutation(order[:size]), order[size:]])


def coverage_floor(budget: int, target_coverage: float) -> int:
    """Examples of the coverage floor: `round(target_coverage · budget)`, leaving the target tasks at least one."""
    return min(int(round(target_coverage * budget)), budget - 1)


def select_targeted(labels: Any, scores: Any, *, data_fraction: float, settings: TargetSettings,
                    seed: int = ClusterSelectConfig.selection_seed, deferred: Any = None,
                    groups: Any = None, thresholds: Any = None) -> tuple[Selection, dict]:
    """Keep exactly `selection_budget(n, data_fraction)` examples for the target tasks (see the module docstring).

    Args:
        labels (array-like of shape `[n_examples]`, int >= 0): cluster of every pool example.
        scores (array-like of shape `[n_examples, n_tasks]`): `relevance_scores` of the pool.
        data_fraction (`float`): share of examples to keep, in (0, 1].
        settings (`TargetSettings`): `target_rule` and `target_coverage`.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the rule's RNG.
        deferred (array-like of shape `[n_examples]`, bool, *optional*): examples without a loss-bearing token.
        groups (array-like of shape `[n_examples]`, int, *optional*): duplicate groups.
        thresholds (array-like of shape `[n_tasks]`, *optional*): `target_self_relevance` of every task, the
            relevant region's threshold (the rules get it as `threshold`); `None` = `inf` (no region).
    Returns:
        (`Selection`, `dict`): the selection (indices sorted, weights summing to n) and what the report shows:
        `kept_per_task` `[n_tasks]` (examples each task's turns picked; when the budget covers every distinct
        example, `all_distinct_kept` is True, every candidate is kept with weight n / kept, and an example counts
        for the task it is most relevant to), `coverage_kept` (examples of the floor), `cluster_relevance`
        (cluster label → mean over its members of their best task's relevance), `mean_relevance_kept` and
        `mean_relevance_pool` (the same best-task relevance, averaged over the kept / all examples).
    Raises:
        ValueError: for mismatched shapes (`scores`, `labels`, `thresholds`, `deferred`, `groups`), negative
            labels, NaN thresholds, a rule that does not return a permutation, or a target share of the budget
            (budget − floor) smaller than the number of target tasks.
        TypeError: if `settings` is not a `TargetSettings`, or the rule does not take `share` / `threshold`.
    """
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64)
    n = labels.size
    if scores.ndim != 2 or scores.shape[0] != n or scores.shape[1] < 1 or (labels < 0).any():
        raise ValueError(f"`scores` must have shape [{n}, n_tasks] and `labels` be >= 0, got {scores.shape}.")
    if not isinstance(settings, TargetSettings):
        raise TypeError(f"`settings` must be a TargetSettings, got {type(settings).__name__}.")
    thresholds = _thresholds(thresholds, scores.shape[1])
    budget = selection_budget(n, data_fraction)
    candidates, copies = _candidates(n, deferred, groups)
    if budget >= candidates.size:  # everything distinct is kept: nothing to rank, every weight n / kept
        kept = _fill_deferred(candidates, deferred, n, budget)
        nearest = np.bincount(scores[kept].argmax(axis=1), minlength=scores.shape[1]).tolist()
        summary = _summary(labels, scores, kept, nearest, 0)
        summary["all_distinct_kept"] = True
        return _selection(kept, np.full(kept.size, n / kept.size), labels), summary
    floor_size = coverage_floor(budget, settings.target_coverage)
    if budget - floor_size < scores.shape[1]:
        raise ValueError(f"the target share of the budget ({budget - floor_size} examples) is smaller than the number "
                         f"of target tasks ({scores.shape[1]}): some tasks would get nothing. Raise data_fraction, "
                         "lower target_coverage, or merge target tasks.")
    floor = _floor(labels, scores, candidates, copies, floor_size)
    taken = np.zeros(n, dtype=bool)
    taken[floor[0]] = True
    owners = _round_robin(labels, scores, candidates, taken, budget - floor[0].size, settings.target_rule, seed,
                          thresholds)
    target_mass = n * (budget - floor[0].size) / budget
    weights = np.zeros(n)
    per_task = []
    for task, chosen in enumerate(owners):
        per_task.append(int(chosen.size))
        if chosen.size:
            weights[chosen] = target_mass / sum(1 for c in owners if c.size) / chosen.size
    if floor[0].size:
        weights[floor[0]] = floor[1] * (n - target_mass) / floor[1].sum()
    kept = np.flatnonzero(weights > 0)
    return _selection(kept, weights[kept], labels), _summary(labels, scores, kept, per_task, int(floor[0].size))


def _thresholds(thresholds: Any, n_tasks: int) -> np.ndarray:
    """`thresholds` as float64 `[n_tasks]` (`None` = all `inf`), checked: no NaN."""
    if thresholds is None:
        return np.full(n_tasks, np.inf)
    try:
        values = np.asarray(thresholds, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"`thresholds` must be numbers, one per target task, got {thresholds!r}.") from None
    if values.shape != (n_tasks,) or np.isnan(values).any():
        raise ValueError(f"`thresholds` must have shape [{n_tasks}] (one per target task) and no NaN, got shape "
                         f"{values.shape}.")
    return values


def _candidates(n: int, deferred: Any, groups: Any) -> tuple[np.ndarray, np.ndarray]:
    """Positions selection ranks (not deferred; the lowest-index copy of each duplicate group) and the examples each
    stands for."""
    for name, values in (("deferred", deferred), ("groups", groups)):
        if values is not None and np.shape(values) != (n,):
            raise ValueError(f"`{name}` must have shape [{n}] (one per example), got {np.shape(values)}.")
    eligible = np.arange(n)
    if deferred is not None:
        mask = np.asarray(deferred, dtype=bool).reshape(-1)
        if not mask.all():
            eligible = np.flatnonzero(~mask)
    if groups is None:
        return eligible, np.ones(eligible.size, dtype=np.int64)
    _, first, counts = np.unique(np.asarray(groups).reshape(-1)[eligible], return_index=True, return_counts=True)
    order = np.argsort(first)
    return eligible[first[order]], counts[order].astype(np.int64)


def _fill_deferred(candidates: np.ndarray, deferred: Any, n: int, budget: int) -> np.ndarray:
    """All candidates, then the lowest-index other examples (deferred first) up to `budget`."""
    rest = np.setdiff1d(np.arange(n), candidates)
    if deferred is not None:
        mask = np.asarray(deferred, dtype=bool).reshape(-1)
        rest = rest[np.lexsort((rest, mask[rest]))]  # duplicates of kept rows before examples without loss tokens
    return np.sort(np.concatenate([candidates, rest[:max(budget - candidates.size, 0)]])).astype(np.int64)


def _floor(labels, scores, candidates, copies, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The coverage floor: `size` candidates spread over clusters by size (proportional quotas), the most relevant
    (best task) members of each. Returns (positions `[size]`, the mass each stands for `[size]`)."""
    if size <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    clusters, position = np.unique(labels[candidates], return_inverse=True)
    sizes = np.bincount(position, weights=copies).astype(np.int64)
    quotas = cluster_quotas(np.bincount(position), size, "proportional")
    best = scores[candidates].max(axis=1)
    chosen, mass = [], []
    for cluster, quota in enumerate(quotas):
        if quota:
            members = np.flatnonzero(position == cluster)
            top = members[np.lexsort((members, -best[members]))[:quota]]
            chosen.append(candidates[top])
            mass.append(np.full(quota, sizes[cluster] / quota))
    return np.concatenate(chosen), np.concatenate(mass)


def _round_robin(labels, scores, candidates, taken, budget: int, rule_name: str, seed: int,
                 thresholds: np.ndarray) -> list[np.ndarray]:
    """The target share: tasks take turns picking their next untaken candidate in their rule's order until
    `budget` are picked (a task whose order is used up drops out). Returns the positions each task picked."""
    rule = TARGET_RULES.get(rule_name)
    share = -(-budget // scores.shape[1])  # what each task takes, the first ones one more
    orders = []
    for task in range(scores.shape[1]):
        rng = np.random.default_rng([int(seed) % 2**64, task])
        try:
            result = rule(scores[candidates, task], labels[candidates], rng, share=share,
                          threshold=float(thresholds[task]))
        except TypeError as error:
            if "share" not in str(error) and "threshold" not in str(error):
                raise
            raise TypeError(f"target rule {rule_name!r} must accept the keywords `share` and `threshold` "
                            f"(`rule(scores, labels, rng, *, share, threshold)`, or `**kwargs`): {error}") from None
        order = np.asarray(result)
        n = candidates.size
        if (order.shape != (n,) or order.dtype.kind not in "iu" or (n and (order.min() < 0 or order.max() >= n))
                or np.unique(order).size != n):
            raise ValueError(f"target rule {rule_name!r} must return a permutation of 0..{n - 1} (an int array of "
                             f"shape [{n}], each position once), got shape {order.shape}, dtype {order.dtype}.")
        orders.append(candidates[order])
    picked: list[list[int]] = [[] for _ in orders]
    cursor = [0] * len(orders)
    remaining = budget
    while remaining > 0:
        progressed = False
        for task, order in enumerate(orders):
            while cursor[task] < order.size and taken[order[cursor[task]]]:
                cursor[task] += 1
            if remaining > 0 and cursor[task] < order.size:
                taken[order[cursor[task]]] = True
                picked[task].append(int(order[cursor[task]]))
                remaining -= 1
                progressed = True
        if not progressed:
            break
    return [np.asarray(p, dtype=np.int64) for p in picked]


def _selection(kept: np.ndarray, weights: np.ndarray, labels: np.ndarray) -> Selection:
    weights = np.asarray(weights, dtype=np.float64) * (labels.size / float(np.sum(weights)))
    return Selection(indices=kept.astype(np.int64), weights=weights, labels=labels[kept], n_total=int(labels.size))


def _summary(labels, scores, kept, per_task: list[int], coverage_kept: int) -> dict:
    clusters, position = np.unique(labels, return_inverse=True)
    best = scores.max(axis=1)
    relevance = np.bincount(position, weights=best) / np.bincount(position)
    return {"kept_per_task": per_task, "coverage_kept": coverage_kept,
            "cluster_relevance": {int(c): round(float(r), 4) for c, r in zip(clusters, relevance)},
            "mean_relevance_kept": round(float(best[kept].mean()), 4),
            "mean_relevance_pool": round(float(best.mean()), 4)}
