"""Tests of the global batch plan (allocation.py): literal plans, invariants over random inputs, token balance."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select.allocation import (
    batches_per_rank,
    mixed_order,
    plan_epoch,
    plan_epoch_paper,
    plan_stats,
)

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
    # Balanced: window 0 (positions 9 2 7 0 6 11 8 1) sorted by length = 11 9 8 7 | 6 2 1 0; the two longest of
    # each block are the batch maxima; window 1 = 5 3 4 10 sorted = 10 5 | 4 3.
    assert plan_epoch(LABELS, LENGTHS, **common) == [[9, 7], [11, 8], [6, 1], [2, 0], [5, 3], [10, 4]]


@pytest.mark.parametrize("balance", [False, True])
def test_short_last_step_is_shared_with_the_one_before(balance):
    # 17 = 16 + 1: a last step of 1 would leave 3 ranks empty, so the last two steps share 17 as 9 + 8.
    plan = plan_epoch([0] * 17, [1] * 17, world_size=4, per_device_batch_size=4, seed=0, epoch=0,
                      balance_tokens=balance)
    assert sorted([len(b) for b in plan[:4]] + [len(b) for b in plan[4:]]) == [2] * 7 + [3]
    assert sorted(p for b in plan for p in b) == list(range(17))


def test_pad_repeats_the_start_of_the_order():
    plan = plan_epoch([0, 0, 0], [1, 2, 3], world_size=4, per_device_batch_size=3, seed=0, epoch=0)
    assert plan == [[2], [0], [2], [1]]  # order 2 0 1, padded cyclically to 4 = W·G slots
    plan = plan_epoch([0] * 5, [1] * 5, world_size=4, per_device_batch_size=1, seed=0, epoch=0, balance_tokens=False)
    assert len(plan) == 8 and all(len(b) == 1 for b in plan)
    counts = Counter(p for b in plan for p in b)
    assert sorted(counts) == [0, 1, 2, 3, 4] and sorted(counts.values()) == [1, 1, 2, 2, 2]


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
    assert all(1 <= len(b) <= batch_size for b in plan)
    counts = Counter(p for b in plan for p in b)
    assert set(counts) == set(range(m))
    if m >= groups * world_size:
        assert all(c == 1 for c in counts.values())  # no drop, no repeat
    else:  # documented pad: B == 1 or m < W; cyclic repeat up to one example per batch
        assert batch_size == 1 or m < world_size
        assert sum(counts.values()) == groups * world_size and max(counts.values()) - min(counts.values()) <= 1
    sizes = [sum(map(len, plan[j * world_size : (j + 1) * world_size])) for j in range(groups)]
    assert sum(s < world_size * batch_size for s in sizes) <= 2  # only the last one or two steps are short
    for j in range(groups):
        step = [len(b) for b in plan[j * world_size : (j + 1) * world_size]]
        assert max(step) - min(step) <= 1


@pytest.mark.parametrize("balance", [False, True])
def test_cluster_mix_per_window(balance):
    rng = np.random.default_rng(1)
    m, w, b, window = 1999, 4, 4, 3
    labels = rng.choice(6, size=m, p=[0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    lengths = lognormal_lengths(m, 1)
    plan = plan_epoch(labels, lengths, world_size=w, per_device_batch_size=b, seed=0, epoch=0,
                      balance_tokens=balance, window=window)
    sizes = np.bincount(labels) / m
    steps_per_unit = window if balance else 1  # unbalanced: every micro-step is a slice of the mixed order
    for start in range(0, len(plan), steps_per_unit * w):
        positions = [p for batch in plan[start : start + steps_per_unit * w] for p in batch]
        deviation = np.bincount(labels[positions], minlength=6) - len(positions) * sizes
        assert np.abs(deviation).max() < 2


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
