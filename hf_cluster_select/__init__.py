"""hf_cluster_select: fine-tune on fewer, better-chosen examples, balanced over data-parallel ranks."""

from .config import ClusterSelectConfig

__all__ = ["ClusterSelectConfig"]
__version__ = "0.1.0"
