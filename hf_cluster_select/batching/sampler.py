"""One global, seed+epoch batch sampler that accelerate shards (layer L2).

`ClusterBatchSampler` yields the per-device batches of an allocation's plan (`allocations.ALLOCATIONS`) as dataset
indices, the same sequence on every rank. It never shards by rank itself: with more than one process, accelerate
wraps it in `BatchSamplerShard` (`split_batches=False`), which gives batch `k` to rank `k % world_size`; the plan is
ordered so that this dealing hands every rank its intended batch of each micro-step. `batch_size = None` tells
accelerate that batch sizes vary (nothing is dropped), and the number of batches is always a multiple of
`world_size`, so accelerate never cycles back to the start to even out the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from .._checks import check_int as _int
from .._checks import check_int_array as _int_array
from ..config import ClusterSelectConfig
from ..settings import AllocationSettings, resolve_balance_tokens
from .allocations import get_allocation
from .curriculum import check_difficulty


class ClusterBatchSampler(Sampler[list[int]]):
    """Batch sampler over the kept examples, balanced in clusters (and tokens) per optimizer micro-step.

    Pass it as `DataLoader(dataset, batch_sampler=sampler)`; `accelerator.prepare` shards it. One iteration yields
    one epoch's plan (`len(self)` batches, a multiple of `world_size`), or exactly `num_batches` batches when given
    (the plans of `epoch`, `epoch + 1`, ... concatenated, then cut), e.g. for a warm-up phase of fixed length.

    Args:
        indices (`np.ndarray` of shape `[m]`, int): dataset index of each kept example.
        labels (`np.ndarray` of shape `[m]`, int): cluster of each kept example.
        lengths (`np.ndarray` of shape `[m]`, int): tokens per kept example, >= 1.
        world_size (`int`): data-parallel ranks `W` (accelerate's `num_processes`).
        per_device_batch_size (`int`): examples per per-device batch `B` (with `balance_tokens`, batches of short examples
            hold up to 4·B, of long ones fewer: see `plan.plan_epoch`).
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the order.
        balance_tokens (`bool` or `"auto"`, *optional*, defaults to `AllocationSettings.balance_tokens`): compose
            micro-steps by length (see `plan_epoch`; `"auto"`: with several ranks, `settings.resolve_balance_tokens`).
        window (`int`, *optional*, defaults to `AllocationSettings.balance_window`): look-ahead in micro-steps when balancing tokens.
        allocation (`str`, *optional*, defaults to `"balanced"`): a name in `allocations.ALLOCATIONS`: `"balanced"`
            (`plan.plan_epoch`) or `"paper"` (`paper.plan_epoch_paper`, CluSTER's one cluster per rank; needs exactly
            `world_size` clusters).
        num_batches (`int`, *optional*): per-device batches to yield per iteration, a positive multiple of
            `world_size`; `None` = one epoch.
        batches_per_rank (`int`, *optional*): per-device batches each rank gets per epoch, fixed in advance instead of
            the allocation's count (`budget_unit="tokens"`: steps then hold about `m / batches_per_rank` examples;
            `plan.plan_epoch(micro_steps=...)`); `"balanced"` allocation only.
        difficulty (`np.ndarray` of shape `[m]`, float, *optional*): difficulty of each kept example (its
            feature-pass loss, nats): every epoch orders each cluster easy to hard (`ClusterSelectConfig(order=
            "easy_to_hard")`, `curriculum.py`); `None` = shuffled. Not with `allocation="paper"`.
    Raises:
        ValueError: if an argument is out of range, the arrays differ in shape, `indices` is not 1-D int, or a
            `difficulty` is given to an allocation with one cluster per rank.
    """

    batch_size = None  # variable batch sizes: accelerate's BatchSamplerShard then drops nothing
    drop_last = False

    def __init__(
        self,
        indices: Any,
        labels: Any,
        lengths: Any,
        *,
        world_size: int,
        per_device_batch_size: int,
        seed: int = ClusterSelectConfig.selection_seed,
        balance_tokens: bool | str = AllocationSettings.balance_tokens,
        window: int = AllocationSettings.balance_window,
        allocation: str = ClusterSelectConfig.allocation,
        num_batches: int | None = None,
        batches_per_rank: int | None = None,
        difficulty: Any = None,
    ) -> None:
        labels = _int_array("labels", labels)
        lengths = _int_array("lengths", lengths, labels.shape)
        indices = _int_array("indices", indices, labels.shape)
        if lengths.min() < 1:
            raise ValueError(f"`lengths` must be >= 1 (tokens), got min {lengths.min()}.")
        strategy = get_allocation(allocation)
        self.world_size = _int("world_size", world_size, 1)
        self.per_device_batch_size = _int("per_device_batch_size", per_device_batch_size, 1)
        self.window = _int("window", window, 1)
        self.seed = _int("seed", seed, -(1 << 63))
        if num_batches is not None and (_int("num_batches", num_batches, 1) % self.world_size):
            raise ValueError(f"`num_batches` must be a multiple of `world_size`={self.world_size}, got {num_batches}.")
        if strategy.exact_clusters and len(np.unique(labels)) != self.world_size:
            raise ValueError(f"`labels` must hold exactly `world_size`={self.world_size} distinct clusters for "
                             f"`allocation`={allocation!r}, got {len(np.unique(labels))}.")
        if batches_per_rank is not None:
            _int("batches_per_rank", batches_per_rank, 1)
        if batches_per_rank is not None and strategy.exact_clusters:
            raise ValueError(f"`batches_per_rank` is only for a step count fixed in advance with the 'balanced' "
                             f"allocation, got allocation={allocation!r}.")
        self.fixed_batches_per_rank = None if batches_per_rank is None else int(batches_per_rank)
        self.difficulty = check_difficulty(difficulty, labels.shape)
        if self.difficulty is not None and strategy.exact_clusters:
            raise ValueError(f"`difficulty` (order='easy_to_hard') needs a cluster-mixed allocation, got "
                             f"allocation={allocation!r} (one cluster per rank has no global order).")
        self.indices = indices
        self.labels = labels
        self.lengths = lengths
        self.balance_tokens = resolve_balance_tokens(balance_tokens, world_size,
                                                     "tokens" if batches_per_rank is not None else "examples")
        self.allocation = allocation
        self.strategy = strategy
        self.num_batches = None if num_batches is None else int(num_batches)
        self.epoch = 0

    @property
    def sampler(self) -> "ClusterBatchSampler":
        """This sampler itself. accelerate's `DataLoaderShard.set_epoch` reaches a sampler wrapped in
        `BatchSamplerShard` only through `batch_sampler.sampler.set_epoch`; this makes it reach `set_epoch`."""
        return self

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration yields (the same on every rank).

        Raises:
            ValueError: if `epoch` is not an int >= 0.
        """
        self.epoch = _int("epoch", epoch, 0)

    def batches_per_epoch(self) -> int:
        """Per-device batches in one epoch's plan (all ranks together), a multiple of `world_size`; no iteration."""
        per_rank = self.fixed_batches_per_rank or self.strategy.batches_per_rank(
            self.labels, self.world_size, self.per_device_batch_size)
        return per_rank * self.world_size

    def __len__(self) -> int:
        """Per-device batches one iteration yields (all ranks together): `num_batches`, or one epoch's plan."""
        return self.num_batches if self.num_batches is not None else self.batches_per_epoch()

    def plan(self, epoch: int) -> list[list[int]]:
        """One epoch's batches as POSITIONS `0..m-1` into `indices` / `labels` / `lengths` (for tests, benchmarks and
        `plan.plan_stats`); `__iter__` yields `indices[positions]`.

        Raises:
            ValueError: if `epoch` is not an int >= 0.
        """
        return self.strategy.plan(self.labels, self.lengths, world_size=self.world_size,
                                  per_device_batch_size=self.per_device_batch_size, seed=self.seed,
                                  epoch=_int("epoch", epoch, 0), balance_tokens=self.balance_tokens,
                                  window=self.window,
                                  **({} if self.fixed_batches_per_rank is None else
                                     {"micro_steps": self.fixed_batches_per_rank}),
                                  **({} if self.difficulty is None else {"difficulty": self.difficulty}))

    def __iter__(self) -> Iterator[list[int]]:
        remaining = len(self)
        epoch = self.epoch
        while remaining > 0:
            batches = self.plan(epoch)[:remaining]
            for positions in batches:
                yield self.indices[positions].tolist()
            remaining -= len(batches)
            epoch += 1
