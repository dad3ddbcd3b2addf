"""ClusterTrainer and ClusterSFTTrainer: drop-in Trainer / SFTTrainer with cluster-based data selection (layer L5).

Both are `ClusterSelectMixin` (mixin.py) placed before the Hugging Face trainer in the bases: no copied logic.
"""

from __future__ import annotations

from transformers import Trainer

from .mixin import ClusterSelectMixin


class ClusterTrainer(ClusterSelectMixin, Trainer):
    """`transformers.Trainer` that trains on a cluster-selected, re-weighted, rank-balanced subset.

    Use it exactly like `Trainer`, plus `cluster_config=ClusterSelectConfig(...)`:

        trainer = ClusterTrainer(model=model, args=args, train_dataset=train, cluster_config=ClusterSelectConfig())
        trainer.train()

    Method: CluSTER (Kim et al., EMNLP 2026) with HDBSCAN clusters, exact budgets and token balance; see README.
    """


try:  # TRL is a core dependency, but keep `ClusterTrainer` importable without it
    from trl import SFTTrainer as _SFTTrainer
except ImportError:  # pragma: no cover
    _SFTTrainer = None

if _SFTTrainer is not None:

    class ClusterSFTTrainer(ClusterSelectMixin, _SFTTrainer):
        """`trl.SFTTrainer` with the same selection as `ClusterTrainer`; features count only loss-bearing tokens
        (completion-only / assistant-only losses are respected)."""

else:  # pragma: no cover
    ClusterSFTTrainer = None

