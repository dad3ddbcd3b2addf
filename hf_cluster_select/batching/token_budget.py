"""Token-budget micro-steps for `plan.plan_epoch(balance_tokens=True)` (layer L2: numpy only).

Ranks need equal *padded* sizes (`examples × longest`), not similar lengths: each micro-step is composed from a
look-ahead of the order so that every rank's batch pads to about the same token budget while the step keeps the
cluster mix (as fairseq's `max_tokens`, but balanced across ranks per step).
"""

from __future__ import annotations

import numpy as np

MAX_EXAMPLES_FACTOR = 4  # a token-balanced per-device batch holds at most 4·B examples
HEAD_FIT = 0.02  # a batch's longest example fits the step's budget when examples × its length is within 2% of it
PARTNER_SPAN = 0.2  # the other examples of a batch come first from those at least 80% as long as its longest


def _compose_step(lens: np.ndarray, clusters: np.ndarray, weight: np.ndarray, anchor: int, budget: float, w: int,
                  least: int, most: int, cap: int, token_cap: int) -> tuple[list[list[int]], np.ndarray]:
    """The `w` batches of one micro-step, as indices into `lens` (the waiting examples, oldest first), each of padded
    size about `budget`, the first one led by `anchor`; `least..most` examples in all. Returns them and the mask of
    the examples used."""
    used, held = np.zeros(len(lens), dtype=bool), np.zeros(len(weight))  # `held`: examples per cluster in the step
    limit = min(budget * (1 + HEAD_FIT), token_cap)

    def take(candidates: np.ndarray) -> int:  # the oldest candidate of the cluster most behind its share of the step
        pick = int(candidates[np.argmin((held[clusters[candidates]] + 1) * weight[clusters[candidates]])])
        used[pick], held[clusters[pick]] = True, held[clusters[pick]] + 1
        return pick

    batches: list[list[int]] = []
    for k in range(w):
        free = np.flatnonzero(~used)
        room = most - int(used.sum()) - (w - 1 - k)  # leave one example for each batch still to build
        no_longer = np.searchsorted(np.sort(lens[free]), lens[free], side="right")  # free ones, itself included
        count = np.clip(np.minimum(np.floor(limit / lens[free]), np.minimum(cap, no_longer)), 1, max(1, room))
        fit = count * lens[free] / budget
        good = free[np.abs(fit - 1) <= HEAD_FIT]
        closest = free[[np.argmin(np.maximum(fit, 1 / fit))]]  # when none fits within `HEAD_FIT`
        head = take(np.array([anchor]) if k == 0 else good if len(good) else closest)
        n, batch = int(count[np.searchsorted(free, head)]) - 1, [head]
        while len(batch) <= n:  # other examples no longer than the leader: close in length first
            near = np.flatnonzero(~used & (lens <= lens[head]) & (lens >= (1 - PARTNER_SPAN) * lens[head]))
            if not len(near):
                break
            batch.append(take(near))
        rest = np.flatnonzero(~used & (lens <= lens[head]))  # then the longest of the shorter ones
        rest = rest[np.argsort(-lens[rest], kind="stable")][: n + 1 - len(batch)]
        used[rest] = True
        batches.append(batch + rest.tolist())
    for i in np.flatnonzero(~used)[: max(0, least - int(used.sum()))]:  # top up to `least`, oldest first
        cost = [(len(x) + 1) * max(lens[x].max(), lens[i]) if len(x) < cap else np.inf for x in batches]
        batches[int(np.argmin(cost))].append(int(i))
        used[i] = True
    return batches, used


def plan_token_balanced(order: np.ndarray, labels: np.ndarray, lengths: np.ndarray, groups: int, w: int, b: int,
                         window: int, rng: np.random.Generator) -> list[list[int]]:
    """`balance_tokens=True` of `plan.plan_epoch`: micro-steps composed one after another from a look-ahead of `order`
    (positions `[m]`); returns `groups · w` batches of positions."""
    _, cluster, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    cluster, weight = cluster.reshape(-1), len(labels) / sizes
    cap, token_cap = MAX_EXAMPLES_FACTOR * b, b * int(lengths.max())
    per_step = max(w * b, -(-len(order) // groups))  # above W·B only for a fixed step count (budget_unit='tokens')
    waiting, since = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)  # examples waiting, oldest first
    taken, scale, carry = 0, 1.0, 0.0
    plan: list[list[int]] = []
    for step in range(groups):
        more = order[taken : taken + max(0, (window + 1) * per_step - len(waiting))]
        waiting, since = np.concatenate([waiting, more]), np.concatenate([since, np.full(len(more), step)])
        taken += len(more)
        lens = lengths[waiting]
        remaining, left = len(waiting) + len(order) - taken, groups - step
        least, most = remaining - (left - 1) * per_step, min(len(waiting), remaining - (left - 1) * w)  # last: rest
        target = min(max(round(remaining / left), least), most)
        overdue = np.flatnonzero(since <= step - window)  # waited `window` steps: lead now, the longest first
        anchor = int(overdue[np.argmax(lens[overdue])]) if len(overdue) else int(np.argmax(lens))
        budget = lens[:target].sum() / w * scale  # the step's share of tokens per rank
        anchor = anchor if len(overdue) or lens[anchor] > budget else 0  # else the oldest
        quotient = budget / lens[anchor] + carry
        up = target == least < most  # round up when the step must take `least` examples (but not the last step)
        copies = np.ceil(quotient) if up else np.floor(quotient + 0.5)
        copies = int(min(max(1, copies), cap, token_cap // lens[anchor]))
        budget, carry = copies * float(lens[anchor]), quotient - copies
        chosen, used = _compose_step(lens, cluster[waiting], weight, anchor, budget, w, least, most, cap, token_cap)
        scale *= 0.7 + 0.3 * target / used.sum()  # feedback on the examples taken (plain arithmetic: same on all hosts)
        plan.extend([waiting[chosen[r]].tolist() for r in rng.permutation(w)])
        waiting, since = waiting[~used], since[~used]
    return plan
