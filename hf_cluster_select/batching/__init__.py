"""Batching stage (layer L2): the global batch plan of every epoch and the sampler accelerate shards.

- `plan.plan_epoch` (`token_budget` for token-balanced micro-steps), `paper.plan_epoch_paper`: one epoch's batches;
  `curriculum` orders each cluster easy to hard (`ClusterSelectConfig(order="easy_to_hard")`).
- `allocations.ALLOCATIONS`: the strategies (`balanced`, `paper`) that pick a plan, the batch count and loss weights.
- `sampler.ClusterBatchSampler`: yields a plan's batches as dataset indices, the same on every rank.
- `meter.TokenBalanceMeter`: measured padded tokens per rank during training.
"""

from .allocations import ALLOCATIONS, get_allocation
from .plan import batches_per_rank, mixed_order, plan_epoch, plan_stats
from .sampler import ClusterBatchSampler

__all__ = ["ALLOCATIONS", "ClusterBatchSampler", "batches_per_rank", "get_allocation", "mixed_order", "plan_epoch",
           "plan_stats"]
