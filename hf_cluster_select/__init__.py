"""hf_cluster_select: fine-tune on fewer, better-chosen examples, balanced over data-parallel ranks.

Swap `transformers.Trainer` for `ClusterTrainer` (or `trl.SFTTrainer` for `ClusterSFTTrainer`); see README.md.
"""

from ._types import ClusteringResult, Selection
from .config import ClusterSelectConfig
from .reporting.report import SelectionReport

__version__ = "0.2.0"

__all__ = [
    "ClusterSelectConfig",
    "ClusterTrainer",
    "ClusterSFTTrainer",
    "ClusterSelectCallback",
    "ClusteringResult",
    "Selection",
    "SelectionReport",
    "SelectionRun",
    "cluster_features",
    "select_subset",
    "__version__",
]

_LAZY = {
    "ClusterTrainer": ".integrations.trainer",
    "ClusterSFTTrainer": ".integrations.sft",
    "ClusterSelectMixin": ".integrations.trainer",
    "ClusterSelectCallback": ".integrations.callbacks",
    "SelectionRun": ".run",
    "cluster_features": ".selection",
    "select_subset": ".selection",
}


def __getattr__(name: str):
    """Import the trainer and the heavy modules on first use, so `import hf_cluster_select` stays light and works
    even when an optional dependency (e.g. hdbscan) is broken."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
