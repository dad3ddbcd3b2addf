"""Tests of ClusterBatchSampler as accelerate shards it (BatchSamplerShard, prepare_data_loader): literal index lists,
equal batch counts per rank, no index lost or repeated, epoch handling, fixed-length (warm-up) mode."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select.batching.sampler import ClusterBatchSampler

INDICES = np.arange(100, 112)
LABELS = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]
LENGTHS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]


def make(world_size=2, batch_size=2, **kwargs) -> ClusterBatchSampler:
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("window", 2)
    return ClusterBatchSampler(INDICES, LABELS, LENGTHS, world_size=world_size, per_device_batch_size=batch_size,
                               **kwargs)


def shards(sampler: ClusterBatchSampler, world_size: int) -> list[list[list[int]]]:
    return [
        list(BatchSamplerShard(sampler, num_processes=world_size, process_index=r, split_batches=False,
                               even_batches=True))
        for r in range(world_size)
    ]


class IndexDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> int:
        return index


def test_literal_sequence_and_shards():
    sampler = make()  # token-budget batches (allocation.plan_epoch): 1..4·B examples each, 2·3 batches per epoch
    expected = [[111, 109], [105, 104], [110], [102, 101, 100], [108, 103], [107, 106]]
    assert list(sampler) == expected and len(sampler) == 6
    assert shards(sampler, 2) == [
        [[111, 109], [110], [108, 103]],
        [[105, 104], [102, 101, 100], [107, 106]],
    ]
    sampler.set_epoch(1)
    assert list(sampler) == [[111], [105, 104, 103], [107, 106], [110, 100], [108, 102], [109, 101]]
    sampler = make(world_size=3, balance_tokens=False)
    assert shards(sampler, 3) == [
        [[100, 111], [110, 101]],
        [[107, 106], [104, 103]],
        [[109, 102], [105, 108]],
    ]


def test_accelerate_compatible_attributes():
    sampler = make()
    assert sampler.batch_size is None and sampler.drop_last is False
    assert not hasattr(sampler, "generator")  # accelerate would synchronise an attribute of that name
    assert sampler.sampler is sampler


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("balance", [False, True])
def test_every_rank_gets_its_share(world_size, balance):
    rng = np.random.default_rng(world_size)
    m = 103
    indices = rng.permutation(1000)[:m]
    sampler = ClusterBatchSampler(indices, rng.integers(0, 4, m), rng.integers(5, 300, m), world_size=world_size,
                                  per_device_batch_size=3, seed=7, balance_tokens=balance, window=3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        full = list(sampler)
        per_rank = shards(sampler, world_size)
        assert len(full) == len(sampler) and len(full) % world_size == 0
        assert {len(x) for x in per_rank} == {len(sampler) // world_size}
        for r in range(world_size):
            assert len(BatchSamplerShard(sampler, num_processes=world_size, process_index=r)) == len(per_rank[r])
            assert per_rank[r] == full[r::world_size]  # the same global order, dealt k -> k % W
        seen = Counter(i for x in per_rank for batch in x for i in batch)
        assert sorted(seen) == sorted(indices.tolist()) and set(seen.values()) == {1}


def test_set_epoch_changes_order_and_reproduces():
    a = make(seed=5)
    b = make(seed=5)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b) == list(a)
    b.set_epoch(4)
    assert list(a) != list(b)
    with pytest.raises(ValueError, match="`epoch`"):
        a.set_epoch(-1)


def test_num_batches_concatenates_and_truncates():
    sampler = make(num_batches=10)
    assert len(sampler) == 10
    out = list(sampler)
    assert len(out) == 10
    epoch0, epoch1 = make().plan(0), make().plan(1)
    assert out == [INDICES[b].tolist() for b in epoch0 + epoch1[:4]]
    short = make(num_batches=2)
    assert list(short) == [INDICES[b].tolist() for b in epoch0[:2]]
    assert [len(x) for x in shards(short, 2)] == [1, 1]
    with pytest.raises(ValueError, match="`num_batches`"):
        make(num_batches=3)


def test_paper_allocation_one_cluster_per_rank():
    labels = np.array([0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0])
    sampler = ClusterBatchSampler(INDICES, labels, LENGTHS, world_size=2, per_device_batch_size=2,
                                  allocation="paper", seed=0)
    per_rank = shards(sampler, 2)
    assert len(sampler) == 6 and [len(x) for x in per_rank] == [3, 3]
    for r in range(2):
        assert {labels[i - 100] for batch in per_rank[r] for i in batch} == {r}
    with pytest.raises(ValueError, match="`labels`"):
        ClusterBatchSampler(INDICES, LABELS, LENGTHS, world_size=2, per_device_batch_size=2, allocation="paper")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(indices=np.arange(3)), "indices"),
        (dict(lengths=[0] * 12), "lengths"),
        (dict(world_size=0), "world_size"),
        (dict(per_device_batch_size=0), "per_device_batch_size"),
        (dict(window=0), "window"),
        (dict(allocation="cyclic"), "allocation"),
    ],
)
def test_validates(kwargs, name):
    args = dict(indices=INDICES, labels=LABELS, lengths=LENGTHS, world_size=2, per_device_batch_size=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"`{name}`"):
        ClusterBatchSampler(args.pop("indices"), args.pop("labels"), args.pop("lengths"), **args)


def test_prepare_data_loader_two_processes():
    sampler = make()
    expected = [[[111, 109], [110], [108, 103]], [[105, 104], [102, 101, 100], [107, 106]]]
    for rank in range(2):
        loader = torch.utils.data.DataLoader(IndexDataset(), batch_sampler=sampler, collate_fn=list)
        prepared = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        assert len(prepared) == 3
        assert list(prepared) == expected[rank]
        # DataLoaderShard.set_epoch reaches the sampler through BatchSamplerShard (via `sampler.sampler`).
        prepared.set_epoch(1)
        assert sampler.epoch == 1
        assert list(prepared) == [x for k, x in enumerate(map(list, sampler)) if k % 2 == rank]
        sampler.set_epoch(0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 120), st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.integers(1, 4),
    st.booleans(), st.integers(0, 2**32 - 1),
)
def test_sharding_invariants(m, world_size, batch_size, n_clusters, window, balance, seed):
    rng = np.random.default_rng(seed)
    indices = rng.permutation(10 * m)[:m]
    sampler = ClusterBatchSampler(indices, rng.integers(0, n_clusters, m), rng.integers(1, 500, m),
                                  world_size=world_size, per_device_batch_size=batch_size, seed=seed,
                                  balance_tokens=balance, window=window)
    full = list(sampler)
    per_rank = shards(sampler, world_size)
    assert len(full) == len(sampler)
    assert all(len(x) == len(sampler) // world_size for x in per_rank)
    assert all(per_rank[r] == full[r::world_size] for r in range(world_size))
    seen = Counter(i for x in per_rank for batch in x for i in batch)
    assert set(seen) == set(indices.tolist())
    if m >= len(sampler):  # otherwise the documented pad: B == 1 or m < W
        assert set(seen.values()) == {1}
