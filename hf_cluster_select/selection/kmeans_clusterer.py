"""KMeans clusterers (layer L2: arrays in, labels out).

- `cluster_method="kmeans"`: KMeans with a cluster-size cap, CluSTER's clusterer (Kim et al., EMNLP 2026, Sec. 3).
- `cluster_method="fine_kmeans"`: KMeans with as many clusters as the budget keeps `kept_per_cluster` examples from
  (K = ceil(budget / kept_per_cluster)): fine strata for the quotas, so that every region of the feature space gets
  its proportional share and the within-cluster rule picks a few representatives from each (stratified sampling
  with coverage; the winner of the linear-probe benchmark, `benchmarks/probe.py`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dataclasses import dataclass, field

from ..config import ClusterSelectConfig
from ..settings import ClusteringSettings, check_bool, check_int_setting, check_optional_int
from .budget import selection_budget
from .clusterers import CLUSTERERS, ClusterFit
from .sampled import nearest_labels, seeded_sample, two_level_kmeans


@dataclass(frozen=True)
class KMeansSettings(ClusteringSettings):
    """Settings of `cluster_method="kmeans"` (CluSTER's clusterer), besides `ClusteringSettings`'.

    Attributes:
        kmeans_n_clusters (`int`, *optional*): K; `None` = the world size (CluSTER's choice), at least 2.
        kmeans_size_cap (`float`, *optional*): cap on cluster sizes as a multiple of n/K (CluSTER: 1.5); `None` =
            no cap.
    Raises:
        ValueError: if `kmeans_n_clusters` < 2 or `kmeans_size_cap` is < 1 or not finite.
    """

    kmeans_n_clusters: int | None = field(default=None, metadata={
        "help": "K for cluster_method='kmeans'; None = the world size (CluSTER's choice), at least 2."})
    kmeans_size_cap: float | None = field(default=None, metadata={
        "help": "Cap on KMeans cluster sizes as a multiple of n/K (CluSTER: 1.5); None = no cap."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_optional_int("kmeans_n_clusters", self.kmeans_n_clusters, 2)
        cap = self.kmeans_size_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 1.0
                                or not math.isfinite(cap)):
            raise ValueError(f"`kmeans_size_cap` must be a finite number >= 1.0 or None, got {cap!r}.")


@dataclass(frozen=True)
class FineKMeansSettings(ClusteringSettings):
    """Settings of `cluster_method="fine_kmeans"` (the default), besides `ClusteringSettings`'.

    Attributes:
        kept_per_cluster (`int`, defaults to `4`): examples the budget keeps per cluster (K = budget / this);
            chosen on the linear-probe benchmark (`benchmarks/probe.py`).
        sharded (`bool`, defaults to `False`): select with every rank holding only its own shard of the features
            (`selection/sharded.py`: fit sample on rank 0, rows routed to their coarse group's owner) instead of
            gathering them all on rank 0; for pools whose features do not fit one machine. Not with a token
            budget, strata, a target set or token near-duplicates; no feature cache.
    Raises:
        ValueError: if `kept_per_cluster` < 1.
        TypeError: if `sharded` is not a bool.
    """

    kept_per_cluster: int = field(default=4, metadata={
        "help": "Examples the budget keeps per fine cluster (K = budget / this)."})
    sharded: bool = field(default=False, metadata={
        "help": "Select with every rank holding only its shard of the features (pools larger than one machine)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int_setting("kept_per_cluster", self.kept_per_cluster, 1)
        check_bool("sharded", self.sharded)


def _capacity_assign(points: np.ndarray, centroids: np.ndarray, capacity: int) -> np.ndarray:
    """Nearest-centroid assignment with at most `capacity` points per centroid.

    Points are ranked by their margin (distance to the second-nearest minus the nearest centroid; ties by index).
    In round r every unassigned point asks for its r-th nearest centroid, which accepts them in rank order while it
    has room. Total capacity ≥ n guarantees every point is placed within K rounds.
    """
    n, n_clusters = points.shape[0], centroids.shape[0]
    distances = np.sqrt(((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2))
    preference = np.argsort(distances, axis=1, kind="stable")
    sorted_distances = np.take_along_axis(distances, preference, axis=1)
    margin = sorted_distances[:, 1] - sorted_distances[:, 0] if n_clusters > 1 else np.zeros(n)
    order = np.lexsort((np.arange(n), -margin))
    labels = np.full(n, -1, dtype=np.int64)
    room = np.full(n_clusters, capacity, dtype=np.int64)
    for round_index in range(n_clusters):
        waiting = order[labels[order] < 0]
        if waiting.size == 0:
            break
        wanted = preference[waiting, round_index]
        for cluster in range(n_clusters):
            accepted = waiting[wanted == cluster][: room[cluster]]
            labels[accepted] = cluster
            room[cluster] -= accepted.size
    return labels


def _cluster_kmeans(
    reduced: np.ndarray, counts: np.ndarray, inverse: np.ndarray, config: ClusterSelectConfig, world_size: int
) -> tuple[np.ndarray, str | None, dict[str, Any]]:
    """KMeans (CluSTER's mode) fitted on the distinct rows weighted by their counts. Returns labels for all rows."""
    from sklearn.cluster import KMeans

    settings = config.cluster_settings
    n_total, n_unique = inverse.size, reduced.shape[0]
    requested = settings.kmeans_n_clusters or max(2, world_size)
    n_clusters = min(requested, n_unique)
    params: dict[str, Any] = {"n_clusters_requested": requested, "size_cap_examples": None}
    fallback = None
    if n_clusters < requested:
        fallback = f"only {n_unique} distinct feature rows: K clipped from {requested} to {n_clusters}"
    if n_clusters == 1:
        return np.zeros(n_total, dtype=np.int64), fallback, params
    sample = seeded_sample(n_unique, settings.cluster_sample_size, config.selection_seed)
    fit_rows = np.arange(n_unique) if sample is None else sample
    kmeans = KMeans(n_clusters=n_clusters, n_init=10, random_state=config.selection_seed)
    kmeans.fit(reduced[fit_rows], sample_weight=counts[fit_rows].astype(np.float64))
    if sample is not None:  # centroids from the sample; every row is placed below, with the cap on all of them
        params.update(sampled_rows=int(sample.size), assignment="nearest_centroid")
    began = time.perf_counter()
    if settings.kmeans_size_cap is None:
        if sample is None:
            return np.asarray(kmeans.labels_, dtype=np.int64)[inverse], fallback, params
        labels_u = nearest_labels(reduced, kmeans.cluster_centers_, np.arange(n_clusters))
        params["assign_seconds"] = time.perf_counter() - began
        return labels_u[inverse], fallback, params
    capacity = math.ceil(round(float(settings.kmeans_size_cap) * n_total / n_clusters, 9))
    params["size_cap_examples"] = capacity
    labels = _capacity_assign(reduced[inverse], kmeans.cluster_centers_, capacity)
    params["assign_seconds"] = time.perf_counter() - began
    return labels, fallback, params



@CLUSTERERS.register("kmeans", settings=KMeansSettings)
def fit_kmeans(
    reduced: np.ndarray, counts: np.ndarray, inverse: np.ndarray, config: ClusterSelectConfig, world_size: int
) -> ClusterFit:
    """KMeans on the distinct rows weighted by their counts (see `clusterers.Clusterer`); no noise."""
    labels, fallback, params = _cluster_kmeans(reduced, counts, inverse, config, world_size)
    return ClusterFit(labels, None, fallback, params)


fit_kmeans.handles_scale = True  # centroids from a sample, the size cap applied to every row (not sampled around)


def requested_clusters(n_rows: int, data_fraction: float, kept_per_cluster: int) -> int:
    """`fine_kmeans`' K before clipping to the distinct rows: ceil(budget / `kept_per_cluster`), at least 1, where
    the budget is `selection_budget(n_rows, data_fraction)`."""
    return max(1, math.ceil(selection_budget(n_rows, data_fraction) / kept_per_cluster))


@CLUSTERERS.register("fine_kmeans", settings=FineKMeansSettings)
def fit_fine_kmeans(
    reduced: np.ndarray, counts: np.ndarray, inverse: np.ndarray, config: ClusterSelectConfig, world_size: int
) -> ClusterFit:
    """KMeans (k-means++ seeding, one init, seeded) with K = ceil(budget / `kept_per_cluster`) clusters,
    clipped to the distinct rows, fitted on the distinct rows weighted by their counts; no noise. Above
    `cluster_sample_size` distinct rows: coarse-then-fine KMeans (`sampled.two_level_kmeans`)."""
    from sklearn.cluster import KMeans

    settings = config.cluster_settings
    n_total, n_unique = int(inverse.size), reduced.shape[0]
    budget = selection_budget(n_total, config.data_fraction)
    requested = requested_clusters(n_total, config.data_fraction, settings.kept_per_cluster)
    n_clusters = min(requested, n_unique)
    params: dict[str, Any] = {"n_clusters_requested": requested, "kept_per_cluster": settings.kept_per_cluster}
    if n_clusters == 1:
        why = (f"only {n_unique} distinct feature row(s): one cluster" if n_unique == 1 else
               f"a budget of {budget} at kept_per_cluster={settings.kept_per_cluster} asks for one cluster")
        return ClusterFit(np.zeros(n_total, dtype=np.int64), None, why, params)
    sample = seeded_sample(n_unique, settings.cluster_sample_size, config.selection_seed)
    if sample is not None:
        seconds: dict[str, float] = {}
        labels = two_level_kmeans(reduced, counts, n_clusters, sample, config.selection_seed, seconds)
        params.update(sampled_rows=int(sample.size), assignment="two_level_kmeans", assign_seconds=seconds["assign"])
        return ClusterFit(labels[inverse], None, None, params)
    kmeans = KMeans(n_clusters=n_clusters, n_init=1, random_state=config.selection_seed)
    kmeans.fit(reduced, sample_weight=counts.astype(np.float64))
    return ClusterFit(np.asarray(kmeans.labels_, dtype=np.int64)[inverse], None, None, params)


fit_fine_kmeans.handles_scale = True  # clustering.py does not sample around it
