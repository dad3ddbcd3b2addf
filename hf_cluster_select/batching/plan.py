"""The global batch plan: which examples form each per-device batch of each optimizer micro-step (layer L2).

A plan is one list of per-device batches, the same on every rank for a given `(seed, epoch)`. accelerate's
`BatchSamplerShard` deals batch `k` to rank `k % world_size`, so consecutive groups of `world_size` batches form one
micro-step (group `j` = batches `[j·W, (j+1)·W)`, rank `r` gets the `r`-th batch of each group). Batches hold
*positions* `0..m-1` into the arrays the plan was built from; the sampler maps them to dataset indices.

Two allocations:
- `plan_epoch` (ours): every micro-step mixes clusters in proportion to their sizes and, with `balance_tokens`, gives
  every rank about the same number of padded tokens (token-budget batches: long examples in small batches, short
  ones in large batches); with a `difficulty`, each cluster's members come easy to hard (`curriculum.py`).
- `plan_epoch_paper` (CluSTER, Kim et al., EMNLP 2026): one cluster per rank, balanced by example count only.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from .._checks import check_int, check_int_array
from ..settings import AllocationSettings, resolve_balance_tokens
from .curriculum import check_difficulty, easy_to_hard
from .token_budget import MAX_EXAMPLES_FACTOR, HEAD_FIT, PARTNER_SPAN, plan_token_balanced  # noqa: F401


def epoch_rng(seed: int, epoch: int, salt: int) -> np.random.Generator:
    """The generator of one epoch's plan: seeded by `(seed, epoch, salt)`, identical on every rank."""
    return np.random.default_rng([int(seed) % (1 << 64), int(epoch) % (1 << 64), salt])


def batches_per_rank(n_examples: int, world_size: int, per_device_batch_size: int) -> int:
    """Number of per-device batches each rank gets in one epoch of `plan_epoch`: `G = ceil(n / (W·B))`.

    Known before selection (the kept count is exact), so the trainer can plan its step count and LR schedule.

    Args:
        n_examples (`int`): examples in the epoch, `m >= 1`.
        world_size (`int`): data-parallel ranks `W >= 1`.
        per_device_batch_size (`int`): most examples per per-device batch `B >= 1`.
    Returns:
        `int`: `G >= 1`; the plan holds `G·W` batches.
    Raises:
        ValueError: if an argument is not an int >= 1.
    """
    n = check_int("n_examples", n_examples, 1)
    w = check_int("world_size", world_size, 1)
    b = check_int("per_device_batch_size", per_device_batch_size, 1)
    return -(-n // (w * b))


def micro_steps_capacity(micro_steps: int, world_size: int, per_device_batch_size: int,
                         token_balanced: bool = True) -> int:
    """Most examples `micro_steps` micro-steps of `plan_epoch` hold: `G·W·B`, or `G·W·MAX_EXAMPLES_FACTOR·B` with
    token-balanced batches (a step count fixed in advance, `budget_unit="tokens"`)."""
    return micro_steps * world_size * per_device_batch_size * (MAX_EXAMPLES_FACTOR if token_balanced else 1)


def mixed_order(labels: Any, rng: np.random.Generator, difficulty: np.ndarray | None = None) -> np.ndarray:
    """Stratified order of positions in which every cluster appears in proportion to its size.

    Each cluster is shuffled (with `difficulty`: then sorted easy to hard, ties in the shuffled order,
    `curriculum.easy_to_hard`; the same random draws either way); the clusters are then merged by
    earliest-deadline-first over quota windows (the "chairman assignment" problem, Tijdeman 1980): with
    `p_c = n_c / m`, cluster `c` takes its `(i+1)`-th slot no earlier than position `floor(i/p_c) + 1` and no later
    than `ceil((i+1)/p_c)`. Ties go to a random cluster priority.

    Guarantee: every prefix of length `L` holds each cluster `c` strictly within 1 of `L·p_c`, so every contiguous
    slice of length `s` holds it strictly within 2 of `s·p_c`.

    Args:
        labels (`np.ndarray` of shape `[m]`, int): cluster of each position (any int values).
        rng (`np.random.Generator`): source of the shuffles.
        difficulty (`np.ndarray` of shape `[m]`, float, *optional*): difficulty of each position (loss, nats);
            `None` = each cluster shuffled.
    Returns:
        `np.ndarray` of shape `[m]`, int64: a permutation of `0..m-1`; with `difficulty`, each cluster's positions
        appear in it in increasing difficulty.
    """
    labels = np.asarray(labels)
    m = labels.shape[0]
    _, inverse = np.unique(labels, return_inverse=True)
    inverse = inverse.reshape(-1)
    members = [rng.permutation(np.flatnonzero(inverse == c)) for c in range(int(inverse.max()) + 1)]
    if difficulty is not None:
        members = [easy_to_hard(x, difficulty) for x in members]
    if len(members) == 1:
        return members[0].astype(np.int64)
    sizes = [len(x) for x in members]
    priority = rng.permutation(len(members)).tolist()
    taken = [0] * len(members)
    pending = [(1, c) for c in range(len(members))]  # (release position, cluster), 1-based positions
    ready: list[tuple[int, int, int]] = []  # (deadline position, priority, cluster)
    out = np.empty(m, dtype=np.int64)
    for position in range(1, m + 1):
        while pending and pending[0][0] <= position:
            _, c = heapq.heappop(pending)
            heapq.heappush(ready, (-(-(taken[c] + 1) * m // sizes[c]), priority[c], c))
        _, _, c = heapq.heappop(ready)  # never empty: sum_c ceil(L·n_c/m) >= L items are released by position L
        out[position - 1] = members[c][taken[c]]
        taken[c] += 1
        if taken[c] < sizes[c]:
            heapq.heappush(pending, (taken[c] * m // sizes[c] + 1, c))
    return out


def _step_sizes(n_slots: int, groups: int, world_size: int, batch_size: int) -> list[int]:
    """Examples per micro-step: full steps of `W·B`, the remainder last; if it is below `W`, the last two steps share
    evenly so that every per-device batch is non-empty."""
    full = world_size * batch_size
    sizes = [full] * (groups - 1) + [n_slots - full * (groups - 1)]
    if sizes[-1] < world_size:  # then groups >= 2 and batch_size >= 2 (see plan_epoch), so both halves are >= W
        both = full + sizes[-1]
        sizes[-2:] = [both - both // 2, both // 2]
    return sizes


def _deal(step: np.ndarray, world_size: int) -> list[list[int]]:
    """Round-robin: batch `r` takes positions `r, r+W, ...` of the step (sizes differ by at most 1)."""
    return [step[r::world_size].tolist() for r in range(world_size)]


def plan_epoch(
    labels: Any,
    lengths: Any,
    *,
    world_size: int,
    per_device_batch_size: int,
    seed: int,
    epoch: int,
    balance_tokens: bool | str = AllocationSettings.balance_tokens,
    window: int = AllocationSettings.balance_window,
    micro_steps: int | None = None,
    difficulty: Any = None,
) -> list[list[int]]:
    """One epoch of per-device batches, every micro-step mixing clusters in proportion and (optionally) tokens balanced.

    `mixed_order` interleaves the clusters (seeded by `(seed, epoch)`); the plan always holds `G·W` batches.
    `balance_tokens=False`: micro-steps of `W·B` examples (a remainder below `W` is shared evenly with the step before)
    take the next examples of the order, shuffled, dealt round-robin (at most `B` per batch).

    `balance_tokens=True` (token-budget batches, as fairseq's `max_tokens`): ranks need equal *padded* sizes
    (`examples × longest`), not similar lengths. Steps are composed one after another from a lookahead of
    `(window + 1)·W·B` examples of the order. A step's budget `T` per batch, about its share of the examples left, is
    rounded to a multiple of the length of its anchor, which leads the first batch: the longest of the examples that
    waited `window` steps, else the longest waiting example if longer than that share, else the oldest one. Every
    other batch is led by an example whose length times the examples that fit under `T` (at most
    `MAX_EXAMPLES_FACTOR·B`) is within `HEAD_FIT` of `T`, from the cluster most behind its share of the step, oldest
    first; its other examples are no longer: first those at least `1 - PARTNER_SPAN` as long (same rule), then the
    longest shorter ones. Every rank thus pads to about `T` while each step spans all lengths and keeps the cluster
    mix, for some padding (5-8% on `benchmarks/balance.py`). A batch holds `1..MAX_EXAMPLES_FACTOR·B` examples (long
    ones few, short ones many), never more padded tokens than `B ×` the longest example; a step's example count
    varies (the Trainer normalises the loss by the loss tokens of the accumulated batch). The last step takes the
    rest. Ranks get a step's batches in random order.

    `difficulty` (`ClusterSelectConfig(order="easy_to_hard")`, `curriculum.py`): each cluster's members enter the
    order easy to hard and the clusters are merged as above, so the epoch runs from easy to hard while every step
    keeps the cluster mix (the prefix guarantee of `mixed_order` holds). Fixed-size steps take consecutive slices of
    that order (shuffled within a step only); token-budget steps take examples from a look-ahead of `window + 1`
    steps of it (by length, not difficulty), so they keep it approximately.

    Pad: every position appears exactly once, except when `m < G·W` (only possible when `B == 1` or `m < W`): then the
    order is repeated cyclically from its start up to `G·W` examples so that every batch is non-empty (one example
    each), and the batches of a micro-step are re-dealt so that no rank gets the same example twice in the epoch.

    Args:
        labels (`np.ndarray` of shape `[m]`, int): cluster of each position.
        lengths (`np.ndarray` of shape `[m]`, int): tokens per example, >= 1.
        world_size (`int`): data-parallel ranks `W`.
        per_device_batch_size (`int`): examples per per-device batch `B` (the most without `balance_tokens`, about the
            average with it).
        seed (`int`): seed of the order; the same `(seed, epoch)` gives the same plan on every rank.
        epoch (`int`): epoch number, >= 0.
        balance_tokens (`bool` or `"auto"`, *optional*, defaults to `AllocationSettings.balance_tokens`):
            token-budget batches of equal padded size per step (`"auto"`: with `world_size` > 1,
            `settings.resolve_balance_tokens`).
        window (`int`, *optional*, defaults to `AllocationSettings.balance_window`): lookahead in micro-steps when balancing tokens (the longest
            example that waited this many steps leads the next step).
        micro_steps (`int`, *optional*): `G`, micro-steps in the epoch, instead of `ceil(m / (W·B))`: a step count
            fixed before the kept count is known (`budget_unit="tokens"`). Needs `balance_tokens` when
            `m > G·W·B` (steps then hold about `m / G` examples) and `m <= G·W·MAX_EXAMPLES_FACTOR·B`.
    Returns:
        `list[list[int]]`: `G·W` non-empty batches of positions in `0..m-1`, each with at most `B` entries
        (`MAX_EXAMPLES_FACTOR·B` with `balance_tokens`).
    Raises:
        ValueError: if an argument is out of range, `labels` and `lengths` (or `difficulty`) differ in shape, or
            `micro_steps` cannot hold the `m` examples.
    """
    labels = check_int_array("labels", labels)
    lengths = check_int_array("lengths", lengths, labels.shape)
    difficulty = check_difficulty(difficulty, labels.shape)
    if lengths.min() < 1:
        raise ValueError(f"`lengths` must be ints >= 1 (tokens), got min {lengths.min()}.")
    w = check_int("world_size", world_size, 1)
    b = check_int("per_device_batch_size", per_device_batch_size, 1)
    window = check_int("window", window, 1)
    check_int("epoch", epoch, 0)
    balance_tokens = resolve_balance_tokens(balance_tokens, w, "tokens" if micro_steps is not None else "examples")
    m = labels.shape[0]
    groups = batches_per_rank(m, w, b) if micro_steps is None else check_int("micro_steps", micro_steps, 1)
    if m > micro_steps_capacity(groups, w, b, balance_tokens):
        raise ValueError(f"`micro_steps`={groups} cannot hold {m} examples at world_size={w}, per_device_batch_size={b}"
                         f" ({'at most ' + str(MAX_EXAMPLES_FACTOR) + '·B per batch' if balance_tokens else 'needs balance_tokens'}).")
    rng = epoch_rng(check_int("seed", seed, -(1 << 63)), epoch, 0)
    order = mixed_order(labels, rng, difficulty)
    if m < groups * w:
        order = np.resize(order, groups * w)  # documented pad: cyclic repeat from the start of the order
    if balance_tokens:
        plan = plan_token_balanced(order, labels, lengths, groups, w, b, window, rng)
    else:
        bounds = np.cumsum([0, *_step_sizes(len(order), groups, w, b)])
        plan = [x for j in range(groups) for x in _deal(rng.permutation(order[bounds[j] : bounds[j + 1]]), w)]
    return _separate_repeats(plan, w) if m < groups * w else plan


def _separate_repeats(plan: list[list[int]], world_size: int) -> list[list[int]]:
    """Re-deal the batches of each micro-step among the ranks so that no rank gets an example twice in the epoch.

    Only the pad repeats examples (fewer than `world_size` of them, each at most once), so in every micro-step fewer
    than `world_size` batches hold an example some rank already has, each excluding one rank: a matching always exists
    (Hall's condition). Steps without a conflict keep their dealing.
    """
    seen: list[set[int]] = [set() for _ in range(world_size)]
    out: list[list[int]] = []
    for start in range(0, len(plan), world_size):
        step = plan[start : start + world_size]
        free = [[r for r in range(world_size) if not seen[r] & set(batch)] for batch in step]
        allowed = [sorted(ranks, key=lambda r, b=b: r != b) for b, ranks in enumerate(free)]  # its own rank first
        if any(not options or options[0] != b for b, options in enumerate(allowed)):
            owner = [-1] * world_size  # rank -> batch, by augmenting paths (Kuhn)

            def assign(b: int, visited: set[int]) -> bool:
                for r in allowed[b]:
                    if r not in visited:
                        visited.add(r)
                        if owner[r] < 0 or assign(owner[r], visited):
                            owner[r] = b
                            return True
                return False

            if not all(assign(b, set()) for b in range(world_size)):  # pragma: no cover - excluded by Hall's condition
                raise RuntimeError("could not keep repeated examples off their rank.")
            step = [step[owner[r]] for r in range(world_size)]
        for r, batch in enumerate(step):
            seen[r].update(batch)
        out.extend(step)
    return out


def plan_stats(plan: list[list[int]], lengths: Any, world_size: int) -> dict[str, float]:
    """Token balance and padding of a plan, per micro-step (groups of `world_size` consecutive batches).

    The cost of a per-device batch is its padded size, `max length × examples` (tokens).

    Args:
        plan (`list[list[int]]`): per-device batches of positions, a multiple of `world_size` of them.
        lengths (`np.ndarray` of shape `[m]`, int): tokens per position.
        world_size (`int`): data-parallel ranks `W`.
    Returns:
        `dict`: `n_micro_steps`; `max_tokens_per_rank` / `mean_tokens_per_rank` (padded tokens of the busiest /
        average rank, averaged over micro-steps); `max_over_mean` (mean over micro-steps of busiest / average);
        `padded_fraction` (padding tokens / padded tokens, all batches); `efficiency` (real tokens /
        (`W` × sum over micro-steps of the busiest rank's padded tokens): the share of rank time spent on real
        tokens, 1.0 = no padding and no waiting).
    Raises:
        ValueError: if `world_size` < 1 or the number of batches is not a positive multiple of it.
    """
    w = check_int("world_size", world_size, 1)
    if len(plan) == 0 or len(plan) % w:
        raise ValueError(f"`plan` must hold a positive multiple of `world_size`={w} batches, got {len(plan)}.")
    lengths = np.asarray(lengths, dtype=np.int64)
    cost = np.array([lengths[x].max() * len(x) if len(x) else 0 for x in plan], dtype=np.float64).reshape(-1, w)
    real = float(sum(lengths[x].sum() for x in plan))
    step_max, step_mean = cost.max(axis=1), cost.mean(axis=1)
    total = float(cost.sum())
    return {
        "n_micro_steps": int(cost.shape[0]),
        "max_tokens_per_rank": float(step_max.mean()),
        "mean_tokens_per_rank": float(step_mean.mean()),
        "max_over_mean": float(np.mean(step_max / np.maximum(step_mean, 1e-12))),
        "padded_fraction": (total - real) / total if total else 0.0,
        "efficiency": real / (w * float(step_max.sum())) if total else 0.0,
    }
