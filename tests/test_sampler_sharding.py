"""The sampler under accelerate's sharding, simulated for many ranks without processes: no double sharding, equal
batch counts for any size / world size / batch / accumulation, and the step plan agreeing with what is yielded.

Each simulated rank wraps the one global `ClusterBatchSampler` in accelerate's `BatchSamplerShard(sampler, W, r)`,
exactly what `accelerator.prepare` does with more than one process.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select.batching.plan import MAX_EXAMPLES_FACTOR
from hf_cluster_select.batching.sampler import ClusterBatchSampler
from hf_cluster_select.schedule import plan_steps


def shards(sampler: ClusterBatchSampler, world_size: int) -> list[list[list[int]]]:
    """What every rank iterates, after checking `len` against what it yields."""
    out = []
    for rank in range(world_size):
        shard = BatchSamplerShard(sampler, num_processes=world_size, process_index=rank)
        batches = list(shard)
        assert len(shard) == len(batches)
        out.append(batches)
    return out


def test_literal_two_rank_split():
    """Six examples, one cluster, two ranks, batch 2, seed 0, fixed-size batches: the exact ids each rank gets.

    Derivation (the documented rule, by hand): the epoch generator `default_rng([0, 0, 0])` permutes the positions
    to [3, 2, 5, 4, 0, 1]; micro-steps hold W·B = 4 then 2 examples; each step is permuted again ([2, 4, 3, 5] and
    [0, 1]) and dealt round-robin, so step 0 gives rank 0 positions [2, 3] and rank 1 [4, 5], step 1 gives [0] and
    [1]; accelerate deals batch k to rank k % 2.
    """
    sampler = ClusterBatchSampler(indices=[10, 11, 12, 13, 14, 15], labels=[0] * 6, lengths=[1] * 6, world_size=2,
                                  per_device_batch_size=2, seed=0, balance_tokens=False)
    assert shards(sampler, 2) == [[[12, 13], [10]], [[14, 15], [11]]]
    sampler.set_epoch(1)
    epoch1 = shards(sampler, 2)
    assert epoch1 != [[[12, 13], [10]], [[14, 15], [11]]]  # a new order each epoch
    assert sorted(i for rank in epoch1 for batch in rank for i in batch) == [10, 11, 12, 13, 14, 15]


@settings(max_examples=150, deadline=None)
@given(
    world_size=st.integers(1, 8),
    per_device=st.integers(1, 6),
    accumulation=st.integers(1, 4),
    extra=st.integers(0, 60),
    n_clusters=st.integers(1, 5),
    balance_tokens=st.booleans(),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
)
def test_balanced_plan_sharded_by_accelerate(world_size, per_device, accumulation, extra, n_clusters, balance_tokens,
                                             seed, epoch):
    n_kept = world_size * per_device * accumulation + extra  # the trainer refuses fewer than one global batch
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.choice(10 * n_kept, size=n_kept, replace=False))
    labels = rng.integers(0, n_clusters, size=n_kept)
    lengths = rng.integers(1, 200, size=n_kept)
    sampler = ClusterBatchSampler(indices=indices, labels=labels, lengths=lengths, world_size=world_size,
                                  per_device_batch_size=per_device, seed=seed, balance_tokens=balance_tokens)
    sampler.set_epoch(epoch)
    per_rank = shards(sampler, world_size)
    plan = plan_steps(n_examples=n_kept, n_kept=n_kept, world_size=world_size, per_device_batch_size=per_device,
                      gradient_accumulation_steps=accumulation, warmup_steps=0, num_train_epochs=1)
    for batches in per_rank:  # equal batch counts, as planned: equal optimizer steps, no rank waits forever
        assert len(batches) == plan.selected_batches_per_epoch
        assert math.ceil(len(batches) / accumulation) == plan.selected_steps_per_epoch
        most = MAX_EXAMPLES_FACTOR * per_device if balance_tokens else per_device  # token-budget batches vary
        assert all(1 <= len(b) <= most for b in batches)
        ids = [i for b in batches for i in b]
        assert len(ids) == len(set(ids)), "an index twice on one rank within an epoch"
    every = [i for batches in per_rank for b in batches for i in b]
    assert set(every) == set(indices.tolist())  # nothing lost, nothing from outside the selection
    pad = len(every) - n_kept  # documented pad: only when the plan has more batch slots than examples (batch 1)
    assert pad == max(0, plan.selected_batches_per_epoch * world_size - n_kept)
    assert pad == 0 or per_device == 1


@settings(max_examples=60, deadline=None)
@given(world_size=st.integers(1, 6), per_device=st.integers(1, 5), accumulation=st.integers(1, 4),
       warmup_steps=st.integers(1, 5), extra=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_warmup_sampler_yields_exactly_the_warmup_batches(world_size, per_device, accumulation, warmup_steps, extra,
                                                          seed):
    n = world_size * per_device * accumulation + extra
    lengths = np.random.default_rng(seed).integers(1, 100, size=n)
    num_batches = warmup_steps * accumulation * world_size
    sampler = ClusterBatchSampler(indices=np.arange(n), labels=np.zeros(n, dtype=np.int64), lengths=lengths,
                                  world_size=world_size, per_device_batch_size=per_device, seed=seed,
                                  num_batches=num_batches)
    per_rank = shards(sampler, world_size)
    assert all(len(batches) == warmup_steps * accumulation for batches in per_rank)


@settings(max_examples=60, deadline=None)
@given(world_size=st.integers(2, 6), per_device=st.integers(1, 5), seed=st.integers(0, 2**16),
       sizes=st.lists(st.integers(1, 40), min_size=6, max_size=6))
def test_paper_plan_sharded_by_accelerate(world_size, per_device, seed, sizes):
    sizes = sizes[:world_size]
    labels = np.repeat(np.arange(world_size), sizes)
    rng = np.random.default_rng(seed)
    labels = labels[rng.permutation(len(labels))]
    indices = np.arange(len(labels)) * 3
    sampler = ClusterBatchSampler(indices=indices, labels=labels, lengths=np.ones(len(labels), dtype=np.int64),
                                  world_size=world_size, per_device_batch_size=per_device, seed=seed,
                                  allocation="paper")
    per_rank = shards(sampler, world_size)
    groups = math.ceil(max(sizes) / per_device)
    for rank, batches in enumerate(per_rank):
        assert len(batches) == groups == len(sampler) // world_size
        members = set(indices[labels == rank].tolist())
        ids = [i for b in batches for i in b]
        assert set(ids) == members and all(1 <= len(b) <= per_device for b in batches)
        if sizes[rank] >= groups:  # no pad needed: every member exactly once
            assert len(ids) == len(members)
    plan = plan_steps(n_examples=len(labels), n_kept=len(labels), world_size=world_size, per_device_batch_size=1,
                      gradient_accumulation_steps=1, warmup_steps=0, num_train_epochs=1,
                      selected_batches_per_epoch=groups)
    assert plan.selected_batches_per_epoch == groups and plan.total_steps == groups


def test_plan_steps_rejects_bad_batch_override():
    with pytest.raises(ValueError, match="selected_batches_per_epoch"):
        plan_steps(n_examples=10, n_kept=10, world_size=1, per_device_batch_size=1, gradient_accumulation_steps=1,
                   warmup_steps=0, num_train_epochs=1, selected_batches_per_epoch=0)
