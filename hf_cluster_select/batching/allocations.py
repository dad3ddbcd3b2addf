"""Allocation strategies: how the kept examples are dealt to ranks and micro-steps, and how their losses are
weighted (layer L2). Chosen by `ClusterSelectConfig.allocation` from `ALLOCATIONS`.

An allocation answers every question that depends on it, in one place:
- `check(world_size, config)`: can it run (before any model work)?
- `selects_before_training`: must the selection exist before the Trainer sizes its LR schedule (the batch count
  depends on the clusters)?
- `exact_clusters`: must unclusterable rows join a cluster instead of forming groups of their own?
- `weights_full_data`: do its loss weights differ from 1 even when every example is kept (`data_fraction=1.0`)?
- `batches_per_rank(labels, world_size, per_device_batch_size)`: per-device batches each rank gets per epoch.
- `plan(labels, lengths, ...)`: one epoch's per-device batches (positions); accelerate deals batch k to rank k % W.
  The sampler passes `difficulty=` (`[m]`, the curriculum order, `curriculum.py`) only when the run orders by it.
- `loss_weights(selection, all_labels, world_size)`: the loss weight of each kept example `[n_kept]`, mean about 1.

Add one: a class with these members and `@ALLOCATIONS.register("name")` (with `settings=` for settings of its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Selection
from ..config import ClusterSelectConfig
from ..registry import ALLOCATIONS
from ..settings import AllocationSettings
from .paper import check_paper_allocation, cluster_rank_weights, plan_epoch_paper
from .plan import batches_per_rank, plan_epoch

@ALLOCATIONS.register("balanced")
class BalancedAllocation:
    """Every micro-step mixes clusters in proportion to their sizes and, with `balance_tokens`, gives every rank about
    the same padded tokens (`plan.plan_epoch`); each kept example carries its selection weight, rescaled to mean 1."""

    selects_before_training = False
    exact_clusters = False
    weights_full_data = False

    def check(self, world_size: int, config: ClusterSelectConfig) -> None:
        """Nothing to check: works on any number of ranks and clusters."""

    def batches_per_rank(self, labels: Any, world_size: int, per_device_batch_size: int) -> int:
        """`ceil(m / (W·B))` for `m = len(labels)` kept examples (known before selection)."""
        return batches_per_rank(len(labels), world_size, per_device_batch_size)

    def plan(self, labels, lengths, *, world_size, per_device_batch_size, seed, epoch,
             balance_tokens=AllocationSettings.balance_tokens, window=AllocationSettings.balance_window,
             micro_steps=None, difficulty=None) -> list[list[int]]:
        """`plan.plan_epoch` (`micro_steps`: a step count fixed in advance; `difficulty` `[m]`: each cluster easy
        to hard; see there)."""
        return plan_epoch(labels, lengths, world_size=world_size, per_device_batch_size=per_device_batch_size,
                          seed=seed, epoch=epoch, balance_tokens=balance_tokens, window=window,
                          micro_steps=micro_steps, difficulty=difficulty)

    def loss_weights(self, selection: Selection, all_labels: np.ndarray, world_size: int) -> np.ndarray:
        """`Selection.loss_weights()`: the selection weights rescaled to mean 1."""
        return selection.loss_weights()


@ALLOCATIONS.register("paper")
class PaperAllocation:
    """CluSTER (Kim et al., EMNLP 2026, Sec. 3): rank `k` trains only cluster `k` (`paper.plan_epoch_paper`),
    balanced by example count, every example of cluster `k` weighted `K·|C_k|/N`; selection before training."""

    selects_before_training = True
    exact_clusters = True
    weights_full_data = True  # K·|C_k|/N per rank, whatever is kept

    def check(self, world_size: int, config: ClusterSelectConfig) -> None:
        """`paper.check_paper_allocation`: at least 2 ranks, KMeans with K = world size."""
        check_paper_allocation(world_size, config.cluster_method, getattr(config.cluster_settings, "kmeans_n_clusters", None))

    def batches_per_rank(self, labels: Any, world_size: int, per_device_batch_size: int) -> int:
        """`ceil(largest kept cluster / B)`: the largest cluster's rank sets the pace."""
        largest = int(np.unique(np.asarray(labels), return_counts=True)[1].max())
        return -(-largest // per_device_batch_size)

    def plan(self, labels, lengths, *, world_size, per_device_batch_size, seed, epoch,
             balance_tokens=AllocationSettings.balance_tokens,
             window=AllocationSettings.balance_window, difficulty=None) -> list[list[int]]:
        """`paper.plan_epoch_paper` (lengths and token balance are not used: CluSTER balances example counts).

        Raises:
            ValueError: for a `difficulty`: one cluster per rank has no global easy-to-hard order.
        """
        if difficulty is not None:
            raise ValueError("`allocation`='paper' has no curriculum order (one cluster per rank): use "
                             "`order`='shuffled' or `allocation`='balanced'.")
        return plan_epoch_paper(labels, world_size=world_size, per_device_batch_size=per_device_batch_size,
                                seed=seed, epoch=epoch)

    def loss_weights(self, selection: Selection, all_labels: np.ndarray, world_size: int) -> np.ndarray:
        """`paper.cluster_rank_weights`: `K·|C_k|/N` for every kept example of cluster `k`."""
        return cluster_rank_weights(selection.labels, all_labels, world_size)


def get_allocation(name: str):
    """An instance of the allocation registered as `name`.

    Raises:
        ValueError: if no allocation has that name.
    """
    return ALLOCATIONS.get(name)()
