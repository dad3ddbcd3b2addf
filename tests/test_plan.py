"""Tests of the global batch plan (allocation.py): literal plans, invariants over random inputs, token balance and
cluster mix of the token-budget batches."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select.batching.plan import (
    MAX_EXAMPLES_FACTOR,
    batches_per_rank,
    mixed_order,
    plan_epoch,
    plan_stats,
)
from hf_cluster_select.batching.paper import plan_epoch_paper

LABELS = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]
LENGTHS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]


def lognormal_lengths(m: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(90), 0.7, m)), 20, 400).astype(np.int64)


def test_batches_per_rank():
    assert batches_per_rank(1, 1, 1) == 1
    assert batches_per_rank(16, 4, 4) == 1
    assert batches_per_rank(17, 4, 4) == 2
    assert batches_per_rank(1000, 8, 4) == 32
    with pytest.raises(ValueError, match="`world_size`"):
        batches_per_rank(10, 0, 4)
    with pytest.raises(ValueError, match="`per_device_batch_size`"):
        batches_per_rank(10, 2, 0)
    with pytest.raises(ValueError, match="`n_examples`"):
        batches_per_rank(0, 2, 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(world_size=0), "world_size"),
        (dict(per_device_batch_size=0), "per_device_batch_size"),
        (dict(window=0), "window"),
        (dict(epoch=-1), "epoch"),
        (dict(lengths=[1, 2]), "lengths"),
        (dict(lengths=[0] * 12), "lengths"),
        (dict(labels=[], lengths=[]), "labels"),
        (dict(labels=[0.5] * 12), "labels"),
    ],
)
def test_plan_epoch_validates(kwargs, name):
    args = dict(labels=LABELS, lengths=LENGTHS, world_size=2, per_device_batch_size=2, seed=0, epoch=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"`{name}`"):
        plan_epoch(args.pop("labels"), args.pop("lengths"), **args)


def test_literal_plans():
    # The order interleaves clusters 1 (6 members), 0 (4) and 2 (2) in proportion.
    assert mixed_order(np.array(LABELS), np.random.default_rng(0)).tolist() == [9, 2, 7, 0, 6, 11, 8, 1, 5, 3, 4, 10]
    common = dict(world_size=2, per_device_batch_size=2, seed=0, epoch=0, window=2)
    # Unbalanced: each micro-step of 4 takes the next 4 of the epoch's order, dealt round-robin.
    assert plan_epoch(LABELS, LENGTHS, balance_tokens=False, **common) == [
        [9, 2], [7, 0], [6, 11], [8, 1], [4, 3], [10, 5]
    ]
    # Balanced (token-budget batches): 16 examples, 2 ranks, B = 4: 2 steps. Order 9 5 14 0 15 1 10 4 | 11 2 12 6 13 3
    # 8 7; step 0 takes at least 8, whose 400 tokens make 200 per rank. No example is longer, so the oldest (9, 50
    # tokens) anchors the budget at 4 × 50 = 200: [9 2 10 3], and the other batch has eight 25-token examples. Step 1
    # takes the other four at 200 per rank too: 2 × 100 (100 and 25 tokens) and 2 × 100.
    labels, lengths = [0] * 8 + [1] * 8, [100, 100, 50, 50, 25, 25, 25, 25, 100, 50, 50, 25, 25, 25, 25, 25]
    plan = plan_epoch(labels, lengths, world_size=2, per_device_batch_size=4, seed=1, epoch=0, window=1)
    assert plan == [[5, 14, 15, 4, 11, 6, 12, 7], [9, 2, 10, 3], [8, 13], [0, 1]]
    assert [len(b) * max(lengths[i] for i in b) for b in plan] == [200] * 4


@pytest.mark.parametrize("balance", [False, True])
def test_short_last_step_is_shared_with_the_one_before(balance):
    # 17 = 16 + 1: a last step of 1 would leave 3 ranks empty, so the last two steps share 17 as 9 + 8.
    plan = plan_epoch([0] * 17, [1] * 17, world_size=4, per_device_batch_size=4, seed=0, epoch=0,
                      balance_tokens=balance)
    assert sorted([len(b) for b in plan[:4]] + [len(b) for b in plan[4:]]) == [2] * 7 + [3]
    assert sorted(p for b in plan for p in b) == list(range(17))


def test_pad_repeats_the_start_of_the_order():
    # Order 2 0 1, padded cyclically to 4 = W·G slots: one example per batch, dealt to the ranks at random.
    assert plan_epoch([0, 0, 0], [1, 2, 3], world_size=4, per_device_batch_size=3, seed=0, epoch=0,
                      balance_tokens=False) == [[2], [1], [0], [2]]
    assert plan_epoch([0, 0, 0], [1, 2, 3], world_size=4, per_device_batch_size=3, seed=0, epoch=0) == [
        [0], [1], [2], [2]
    ]
    plan = plan_epoch([0] * 5, [1] * 5, world_size=4, per_device_batch_size=1, seed=0, epoch=0, balance_tokens=False)
    assert len(plan) == 8 and all(len(b) == 1 for b in plan)
    counts = Counter(p for b in plan for p in b)
    assert sorted(counts) == [0, 1, 2, 3, 4] and sorted(counts.values()) == [1, 1, 2, 2, 2]


def test_step_never_takes_more_than_is_waiting():
    # window 1: the lookahead holds 2·W·B examples, fewer than W batches of up to 4·B could take (a regression).
    lengths = [1, 3, 1, 5, 1, 2, 5, 3, 50, 6, 50, 6, 8, 4, 6, 50, 9, 5, 50, 3, 1, 9, 6, 50, 50, 8, 4, 7, 7, 1, 3]
    plan = plan_epoch([0] * 31, lengths, world_size=2, per_device_batch_size=2, seed=0, epoch=0, window=1)
    assert len(plan) == 16 and all(plan) and sorted(p for b in plan for p in b) == list(range(31))


def test_same_seed_and_epoch_reproduce_other_epochs_differ():
    labels, lengths = np.arange(200) % 5, lognormal_lengths(200)
    a = plan_epoch(labels, lengths, world_size=4, per_device_batch_size=4, seed=3, epoch=1)
    assert a == plan_epoch(labels, lengths, world_size=4, per_device_batch_size=4, seed=3, epoch=1)
    assert a != plan_epoch(labels, lengths, world_size=4, per_device_batch_size=4, seed=3, epoch=2)
    assert a != plan_epoch(labels, lengths, world_size=4, per_device_batch_size=4, seed=4, epoch=1)


@st.composite
def structures(draw):
    m = draw(st.integers(1, 300))
    n_clusters = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    skew = draw(st.sampled_from([0.1, 1.0, 10.0]))
    labels = rng.choice(n_clusters, size=m, p=rng.dirichlet(np.full(n_clusters, skew))) * 7 - 3  # any int values
    return labels, lognormal_lengths(m, seed), seed


@settings(max_examples=80, deadline=None)
@given(structures())
def test_mixed_order_quota(structure):
    labels, _, seed = structure
    order = mixed_order(labels, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(len(labels)))
    clusters, sizes = np.unique(labels, return_counts=True)
    onehot = labels[order][:, None] == clusters[None, :]
    cum = np.vstack([np.zeros((1, len(clusters))), np.cumsum(onehot, axis=0)])
    prefix = np.arange(len(labels) + 1)[:, None] * sizes / len(labels)
    assert np.abs(cum - prefix).max() < 1  # every prefix: each cluster strictly within 1 of its share
    for s in {1, 7, len(labels)}:  # every slice: strictly within 2
        if s <= len(labels):
            assert np.abs(cum[s:] - cum[:-s] - s * sizes / len(labels)).max() < 2


@settings(max_examples=80, deadline=None)
@given(structures(), st.integers(1, 6), st.integers(1, 6), st.booleans(), st.integers(1, 5), st.integers(0, 3))
def test_plan_invariants(structure, world_size, batch_size, balance, window, epoch):
    labels, lengths, seed = structure
    m = len(labels)
    plan = plan_epoch(labels, lengths, world_size=world_size, per_device_batch_size=batch_size, seed=seed,
                      epoch=epoch, balance_tokens=balance, window=window)
    groups = batches_per_rank(m, world_size, batch_size)
    assert len(plan) == groups * world_size
    assert all(len(b) == len(set(b)) for b in plan)
    if balance:  # token-budget batches: 1..4·B examples, never more padded tokens than B × the longest example
        assert all(1 <= len(b) <= MAX_EXAMPLES_FACTOR * batch_size for b in plan)
        assert all(len(b) * lengths[b].max() <= batch_size * lengths.max() for b in plan)
    else:
        assert all(1 <= len(b) <= batch_size for b in plan)
    if batch_size == 1:
        assert all(len(b) == 1 for b in plan)
    counts = Counter(p for b in plan for p in b)
    assert set(counts) == set(range(m))
    if m >= groups * world_size:
        assert all(c == 1 for c in counts.values())  # no drop, no repeat
    else:  # documented pad: B == 1 or m < W; cyclic repeat up to one example per batch
        assert batch_size == 1 or m < world_size
        assert sum(counts.values()) == groups * world_size and max(counts.values()) - min(counts.values()) <= 1
    if not balance:
        sizes = [sum(map(len, plan[j * world_size : (j + 1) * world_size])) for j in range(groups)]
        assert sum(s < world_size * batch_size for s in sizes) <= 2  # only the last one or two steps are short
        for j in range(groups):
            step = [len(b) for b in plan[j * world_size : (j + 1) * world_size]]
            assert max(step) - min(step) <= 1


def test_cluster_mix_per_step_unbalanced():
    rng = np.random.default_rng(1)
    m, w, b = 1999, 4, 4
    labels = rng.choice(6, size=m, p=[0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    plan = plan_epoch(labels, lognormal_lengths(m, 1), world_size=w, per_device_batch_size=b, seed=0, epoch=0,
                      balance_tokens=False)
    sizes = np.bincount(labels) / m
    for start in range(0, len(plan), w):  # every micro-step is a slice of the mixed order
        positions = [p for batch in plan[start : start + w] for p in batch]
        assert np.abs(np.bincount(labels[positions], minlength=6) - len(positions) * sizes).max() < 2


@pytest.mark.parametrize("window", [1, 3, 8])
def test_token_balanced_steps_keep_the_cluster_mix(window):
    # Lengths tied to clusters (cluster c: 40·(c+1) tokens ± 20%): composing steps of similar lengths would make them
    # single-cluster; token-budget batches keep every step nearly as mixed as random steps of the same sizes (about
    # 1.2-1.6× their mean distance here, where the length alone tells the cluster; 0.3× that of length-sorted steps).
    rng = np.random.default_rng(1)
    m, w, b = 2000, 8, 4
    labels = rng.choice(6, size=m, p=[0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    lengths = np.round(40 * (labels + 1) * rng.uniform(0.8, 1.2, m)).astype(np.int64)
    plan = plan_epoch(labels, lengths, world_size=w, per_device_batch_size=b, seed=0, epoch=0, window=window)
    steps = [np.concatenate(plan[j : j + w]) for j in range(0, len(plan), w)]
    share = np.bincount(labels) / m

    def mix(groups: list[np.ndarray]) -> float:  # mean total-variation distance of the steps' cluster shares
        shares = [np.bincount(labels[g], minlength=6) / len(g) for g in groups]
        return float(np.mean([0.5 * np.abs(x - share).sum() for x in shares]))

    bounds = np.cumsum([0] + [len(x) for x in steps])
    random_order, by_length = rng.permutation(m), np.argsort(lengths, kind="stable")
    random_steps = [random_order[bounds[j] : bounds[j + 1]] for j in range(len(steps))]
    length_steps = [by_length[bounds[j] : bounds[j + 1]] for j in range(len(steps))]
    assert mix(steps) < 1.75 * mix(random_steps) and mix(steps) < 0.4 * mix(length_steps)
    assert plan_stats(plan, lengths, w)["max_over_mean"] <= 1.05
    # examples are taken from a lookahead of (window + 1)·W·B of the mixed order: every prefix of steps holds each
    # cluster within that of its share
    lookahead = (window + 1) * w * b
    held = np.cumsum([np.bincount(labels[x], minlength=6) for x in steps], axis=0)
    assert np.abs(held - held.sum(axis=1, keepdims=True) * share).max() <= lookahead + 1


def test_token_budget_batches():
    # Long examples form small batches, short ones large; every rank of a step pads to about the same size.
    rng = np.random.default_rng(3)
    m, w, b = 3000, 4, 4
    lengths = np.where(rng.random(m) < 0.2, rng.integers(300, 513, m), rng.integers(30, 90, m))
    labels = rng.integers(0, 5, m)
    plan = plan_epoch(labels, lengths, world_size=w, per_device_batch_size=b, seed=0, epoch=0, window=8)
    assert len(plan) == batches_per_rank(m, w, b) * w and sorted(p for x in plan for p in x) == list(range(m))
    longest = np.array([lengths[x].max() for x in plan])
    counts = np.array([len(x) for x in plan])
    assert counts[longest >= 300].mean() < 2.5 < b < 6 < counts[longest < 90].mean() <= MAX_EXAMPLES_FACTOR * b
    steps = (counts * longest).reshape(-1, w)
    assert np.median(steps.max(axis=1) / steps.mean(axis=1)) < 1.03
    assert len(set(counts.reshape(-1, w).sum(axis=1).tolist())) > 1  # examples per step vary, batches per step do not


def test_token_balance_lognormal():
    m, w, b = 8192, 8, 4
    lengths = lognormal_lengths(m, 0)
    labels = np.random.default_rng(0).integers(0, 10, m)
    common = dict(world_size=w, per_device_batch_size=b, seed=0, epoch=0)
    balanced = plan_stats(plan_epoch(labels, lengths, **common), lengths, w)
    plain = plan_stats(plan_epoch(labels, lengths, balance_tokens=False, **common), lengths, w)
    assert balanced["max_over_mean"] <= 1.05
    assert plain["max_over_mean"] > 1.4
    assert balanced["padded_fraction"] < 0.5 * plain["padded_fraction"]
    assert balanced["efficiency"] > 2 * plain["efficiency"]
    assert balanced["max_tokens_per_rank"] < 0.5 * plain["max_tokens_per_rank"]


def test_plan_stats_literal():
    lengths = np.array([10, 20, 30, 40])
    stats = plan_stats([[0, 1], [2], [3], [0]], lengths, 2)  # costs: step 0 = 40, 30; step 1 = 40, 10
    assert stats["n_micro_steps"] == 2
    assert stats["max_tokens_per_rank"] == 40.0
    assert stats["mean_tokens_per_rank"] == pytest.approx((35 + 25) / 2)
    assert stats["max_over_mean"] == pytest.approx((40 / 35 + 40 / 25) / 2)
    assert stats["padded_fraction"] == pytest.approx((120 - 110) / 120)
    assert stats["efficiency"] == pytest.approx(110 / (2 * 80))
    with pytest.raises(ValueError, match="`plan`"):
        plan_stats([[0]], lengths, 2)


def test_paper_literal_and_unequal_sizes():
    # Equal sizes (3 and 4 members): rank 0 only cluster 0, rank 1 only cluster 1, 2 steps.
    assert plan_epoch_paper([0, 1, 0, 1, 0, 1, 1], world_size=2, per_device_batch_size=2, seed=0, epoch=0) == [
        [2, 4], [3, 5], [0], [1, 6]
    ]
    # Cluster 0 has one member, cluster 1 six: G = ceil(6 / 2) = 3, the single member is repeated (documented pad).
    assert plan_epoch_paper([0, 1, 1, 1, 1, 1, 1], world_size=2, per_device_batch_size=2, seed=0, epoch=0) == [
        [0], [2, 5], [0], [6, 4], [0], [3, 1]
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**32 - 1), st.integers(0, 40))
def test_paper_invariants(world_size, batch_size, seed, extra):
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(world_size), rng.integers(0, world_size, extra)]) + 5
    plan = plan_epoch_paper(labels, world_size=world_size, per_device_batch_size=batch_size, seed=seed, epoch=0)
    sizes = np.bincount(labels - 5)
    groups = -(-sizes.max() // batch_size)
    assert len(plan) == groups * world_size
    assert all(1 <= len(b) <= batch_size for b in plan)
    for k, batch in enumerate(plan):
        assert set(labels[batch]) == {5 + k % world_size}
    counts = Counter(p for b in plan for p in b)
    assert set(counts) == set(range(len(labels)))
    assert all(c == 1 for p, c in counts.items() if sizes[labels[p] - 5] >= groups)
    if sizes.max() - sizes.min() <= 1:
        assert groups == batches_per_rank(len(labels), world_size, batch_size)


def test_paper_needs_world_size_clusters():
    with pytest.raises(ValueError, match="`labels`"):
        plan_epoch_paper([0, 1, 2], world_size=2, per_device_batch_size=2, seed=0, epoch=0)
