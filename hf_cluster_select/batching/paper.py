"""CluSTER's allocation (Kim et al., EMNLP 2026, Sec. 3): one cluster per rank (layer L2: numpy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import check_int, check_int_array
from .plan import epoch_rng


def check_paper_allocation(world_size: int, cluster_method: str, kmeans_n_clusters: int | None) -> None:
    """Fail early (before any model work) when CluSTER's one-cluster-per-rank allocation cannot work.

    Args:
        world_size (`int`): data-parallel ranks `W`.
        cluster_method (`str`): `ClusterSelectConfig.cluster_method`.
        kmeans_n_clusters (`int` or `None`): the `kmeans_n_clusters` setting (`None` = `W`).
    Raises:
        ValueError: with fewer than 2 ranks, a clusterer other than KMeans (HDBSCAN chooses its own number of
            clusters), or a KMeans `K` other than `W`.
    """
    if world_size < 2:
        raise ValueError(f"`allocation`='paper' gives each rank one cluster and needs at least 2 processes, got "
                         f"world_size {world_size}; use `allocation`='balanced' on one process.")
    if cluster_method != "kmeans":
        raise ValueError(f"`allocation`='paper' needs exactly world_size={world_size} clusters: use "
                         f"`cluster_method`='kmeans' (got {cluster_method!r}), e.g. ClusterSelectConfig.paper().")
    if kmeans_n_clusters not in (None, world_size):
        raise ValueError(f"`allocation`='paper' needs `kmeans_n_clusters` = world_size {world_size} (or None), got "
                         f"{kmeans_n_clusters}.")


def plan_epoch_paper(
    labels: Any, *, world_size: int, per_device_batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """CluSTER's allocation (Kim et al., EMNLP 2026): rank `k` trains only on cluster `k`, every step.

    The distinct labels, sorted, are mapped to ranks `0..W-1` (there must be exactly `W`). The epoch has
    `G = ceil(max_k n_k / B)` micro-steps; each cluster's members, shuffled, are cut into `G` consecutive batches of
    near-equal size (`np.array_split`), so every member appears exactly once and every rank finishes together. With
    equal cluster sizes (CluSTER's uniform quota, or sizes differing by 1) every rank gets the same count per step
    and `G == batches_per_rank(m, W, B)`; a smaller cluster gets smaller batches (its rank's loss weight
    `K·|C_k|/N`, applied by the trainer, keeps the mixture right). Pad: a cluster with fewer than `G` members is
    repeated cyclically from the start of its order so that none of its batches is empty.

    Args:
        labels (`np.ndarray` of shape `[m]`, int): cluster of each position, exactly `world_size` distinct values.
        world_size (`int`): data-parallel ranks `W`, equal to the number of clusters.
        per_device_batch_size (`int`): most examples per per-device batch `B`.
        seed (`int`): seed of the order.
        epoch (`int`): epoch number, >= 0.
    Returns:
        `list[list[int]]`: `G·W` non-empty batches of positions; batch `j·W + k` holds only members of cluster `k`.
    Raises:
        ValueError: if an argument is out of range or `labels` does not hold exactly `world_size` distinct values.
    """
    labels = check_int_array("labels", labels)
    w = check_int("world_size", world_size, 1)
    b = check_int("per_device_batch_size", per_device_batch_size, 1)
    check_int("epoch", epoch, 0)
    clusters = np.unique(labels)
    if len(clusters) != w:
        raise ValueError(f"`labels` must hold exactly `world_size`={w} distinct clusters for the paper allocation, "
                         f"got {len(clusters)}.")
    rng = epoch_rng(check_int("seed", seed, -(1 << 63)), epoch, 1)
    members = [rng.permutation(np.flatnonzero(labels == c)) for c in clusters]
    groups = max(-(-len(x) // b) for x in members)
    per_rank = [np.array_split(np.resize(x, max(len(x), groups)), groups) for x in members]
    return [per_rank[k][j].tolist() for j in range(groups) for k in range(w)]


def cluster_rank_weights(kept_labels: Any, labels: Any, n_ranks: int) -> np.ndarray:
    """CluSTER's per-rank loss weight (Kim et al., EMNLP 2026) as a weight per kept example: `K·|C_k|/N`.

    With one cluster per rank, rank `k` sees only cluster `k`; data-parallel training averages the ranks' gradients
    with equal weight `1/K`, so multiplying rank `k`'s loss by `K·|C_k|/N` restores each cluster's full-data share
    `|C_k|/N` in the update. Every example of cluster `k` gets that weight, so a per-example weighted loss applies
    exactly the per-rank factor.

    Args:
        kept_labels (`np.ndarray` of shape `[n_kept]`, int): cluster of each kept example.
        labels (`np.ndarray` of shape `[n_examples]`, int): cluster of every example of the full data (`|C_k|`, `N`).
        n_ranks (`int`): number of clusters = ranks `K` (>= 1).
    Returns:
        `np.ndarray` of shape `[n_kept]`, float64.
    Raises:
        ValueError: if `n_ranks` < 1, `labels` is empty, or a kept label does not occur in `labels`.
    """
    labels, kept_labels = np.asarray(labels).reshape(-1), np.asarray(kept_labels).reshape(-1)
    if n_ranks < 1 or labels.size == 0:
        raise ValueError(f"`n_ranks` must be >= 1 and `labels` non-empty, got {n_ranks} and {labels.size} labels.")
    clusters, sizes = np.unique(labels, return_counts=True)
    position = np.searchsorted(clusters, kept_labels)
    if kept_labels.size and (position.max() >= clusters.size or np.any(clusters[position] != kept_labels)):
        raise ValueError("`kept_labels` holds a cluster that does not occur in `labels`.")
    return n_ranks * sizes[position].astype(np.float64) / labels.size
