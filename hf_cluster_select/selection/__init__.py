"""Selection stage (layer L2, pure functions over arrays): clustering → per-cluster quotas → within-cluster rules.

- `clustering.cluster_features`: L2-normalise, merge duplicates, PCA, then a clusterer from `clusterers.CLUSTERERS`
  (`hdbscan_clusterer`, `kmeans_clusterer`).
- `near_duplicates.near_duplicate_groups`: examples whose tokens are near copies (MinHash + LSH), joined with the
  feature-space duplicate groups when `near_duplicate_threshold` is set.
- `budget.selection_budget`: the exact number of examples a `data_fraction` keeps.
- `quotas.cluster_quotas`: the budget split over clusters.
- `within_cluster.WITHIN_CLUSTER_RULES`: which members of a cluster are kept, and their weights (the rules in
  `within_cluster.py`, `coverage_rules.py`, `signal_rules.py`).
- `select.select_from_labels` / `select.select_subset`: all of the above for one clustering.
- `targeted.select_targeted`: the budget spent on a target set's tasks instead (`targeted.relevance_scores`).
- `sharded.select_sharded`: the `fine_kmeans` selection with every rank holding only its shard of the features
  (`sharded_owner.py`: rows routed to their coarse group's owner), for pools larger than one machine.
"""

from .budget import selection_budget
from .clustering import cluster_features
from .clusterers import CLUSTERERS, ClusterFit
from .near_duplicates import near_duplicate_groups
from .quotas import cluster_quotas
from .select import select_from_labels, select_subset
from .sharded import select_sharded
from .within_cluster import WITHIN_CLUSTER_RULES
from .targeted import relevance_scores, select_targeted, target_self_relevance
from . import coverage_rules, signal_rules, targeted  # noqa: E402,F401  (register their rules)

__all__ = [
    "CLUSTERERS",
    "ClusterFit",
    "WITHIN_CLUSTER_RULES",
    "cluster_features",
    "cluster_quotas",
    "near_duplicate_groups",
    "select_from_labels",
    "select_sharded",
    "select_subset",
    "select_targeted",
    "relevance_scores",
    "target_self_relevance",
    "selection_budget",
]
