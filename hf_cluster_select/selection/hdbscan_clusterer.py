"""HDBSCAN clusterer (Campello, Moulavi & Sander, PAKDD 2013; the `hdbscan` package of McInnes, Healy & Astels,
JOSS 2017), registered as `cluster_method="hdbscan"` (layer L2: arrays in, labels out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._imports import require_hdbscan
from ..config import ClusterSelectConfig
from ..settings import ClusteringSettings, check_choice, check_optional_int, choices_of
from .clusterers import CLUSTERERS, ClusterFit

# HDBSCAN's `algorithm="generic"` (a dense float64 distance matrix, n² · 8 bytes) beat the tree algorithms on
# high-dimensional data (5,000 × 128: 1.5 s vs 2.4 s for prims_kdtree) but lost at ≤ 64 dims (5,000 × 16: 1.7 s vs
# 0.4 s). prims_kdtree beat boruvka_kdtree at every size measured up to 50,000 × 16 on one core.
GENERIC_MIN_DIM = 65
GENERIC_MAX_POINTS = 5000
# Fewer distinct rows than this (with an automatic min_cluster_size) are not worth clustering: one cluster.
AUTO_MIN_POINTS = 5


@dataclass(frozen=True)
class HDBSCANSettings(ClusteringSettings):
    """Settings of `cluster_method="hdbscan"`, besides `ClusteringSettings`'.

    Attributes:
        hdbscan_min_cluster_size (`int`, *optional*): HDBSCAN's `min_cluster_size` (>= 2); `None` =
            clamp(round(sqrt(n) / 2.5), 5, 100).
        hdbscan_min_samples (`int`, *optional*): HDBSCAN's `min_samples` (>= 1); `None` = 1 (least noise; measured
            best on the Natural-Instructions skills, `benchmarks/clustering_ni.py`).
        noise_policy (`str`, defaults to `"assign"`): noise points (label -1) join their most probable cluster
            (`"assign"`) or form one extra group (`"own_cluster"`).
    Raises:
        ValueError: for a value out of range.
    """

    hdbscan_min_cluster_size: int | None = field(default=None, metadata={
        "help": "HDBSCAN min_cluster_size (>= 2); None = clamp(round(sqrt(n) / 2.5), 5, 100)."})
    hdbscan_min_samples: int | None = field(default=None, metadata={
        "help": "HDBSCAN min_samples (>= 1); None = 1 (least noise, measured best)."})
    noise_policy: str = field(default="assign", metadata={
        "help": "What happens to HDBSCAN noise points (label -1): 'assign' = most probable cluster by membership "
                "vectors; 'own_cluster' = noise forms one extra group.",
        "choices": ["assign", "own_cluster"]})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_optional_int("hdbscan_min_cluster_size", self.hdbscan_min_cluster_size, 2)
        check_optional_int("hdbscan_min_samples", self.hdbscan_min_samples, 1)
        check_choice("noise_policy", self.noise_policy, choices_of(HDBSCANSettings, "noise_policy"))

    def resolved_min_cluster_size(self, n_examples: int) -> int:
        """`min_cluster_size` for `n_examples` points: the setting, or clamp(round(sqrt(n) / 2.5), 5, 100), never
        more than `n_examples` and never below 2."""
        if self.hdbscan_min_cluster_size is not None:
            size = self.hdbscan_min_cluster_size
        else:
            size = min(100, max(5, round(math.sqrt(n_examples) / 2.5)))
        return max(2, min(size, n_examples))

    def resolved_min_samples(self) -> int:
        """`min_samples`: the setting, or 1."""
        return 1 if self.hdbscan_min_samples is None else self.hdbscan_min_samples


def _centroid_assign(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (Euclidean; ties → lowest index) for every row of `points`."""
    distances = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(distances, axis=1)


def _run_hdbscan(points: np.ndarray, min_cluster_size: int, min_samples: int) -> tuple[np.ndarray, Any, bool, str]:
    """Fit HDBSCAN; refit with `allow_single_cluster=True` when the first fit labels everything noise.

    Returns:
        (labels `[n]` with -1 = noise, fitted clusterer, whether the single-cluster refit was used, algorithm name).
    """
    hdbscan = require_hdbscan()
    n, dim = points.shape
    algorithm = "generic" if dim >= GENERIC_MIN_DIM and n <= GENERIC_MAX_POINTS else "prims_kdtree"
    kwargs = {
        "min_cluster_size": min_cluster_size,
        "min_samples": min_samples,
        "prediction_data": True,
        "core_dist_n_jobs": 1,
        "algorithm": algorithm,
    }
    clusterer = hdbscan.HDBSCAN(**kwargs).fit(points)
    single = False
    if (clusterer.labels_ < 0).all():
        clusterer = hdbscan.HDBSCAN(allow_single_cluster=True, **kwargs).fit(points)
        single = True
    return np.asarray(clusterer.labels_, dtype=np.int64), clusterer, single, algorithm


def _assign_noise_by_membership(points: np.ndarray, raw: np.ndarray, clusterer: Any, n_found: int) -> np.ndarray:
    """Most probable cluster of each noise point (argmax of `hdbscan.all_points_membership_vectors`), nearest
    centroid where the vector is NaN or all zero."""
    labels = raw.copy()
    noise = np.flatnonzero(raw < 0)
    if noise.size == 0:
        return labels
    if n_found == 1:
        labels[noise] = 0
        return labels
    hdbscan = require_hdbscan()
    membership = np.asarray(hdbscan.all_points_membership_vectors(clusterer), dtype=np.float64)
    membership = membership.reshape(points.shape[0], -1)[noise]
    usable = np.isfinite(membership).all(axis=1) & (membership.shape[1] == n_found)
    usable &= np.nan_to_num(membership).max(axis=1) > 0
    choice = np.argmax(np.nan_to_num(membership, nan=-1.0), axis=1)
    if not usable.all():
        centroids = np.stack([points[raw == c].mean(axis=0) for c in range(n_found)])
        choice[~usable] = _centroid_assign(points[noise[~usable]], centroids)
    labels[noise] = choice
    return labels


def _cluster_hdbscan(
    reduced: np.ndarray, counts: np.ndarray, n_total: int, config: ClusterSelectConfig
) -> tuple[np.ndarray, np.ndarray, str | None, dict[str, Any]]:
    """HDBSCAN on the distinct rows. Returns (labels, raw labels, fallback, params), all per distinct row.

    A "pile" (one row repeated at least `resolved_min_cluster_size(n_total)` times) is a cluster of infinite density
    in HDBSCAN's terms, so it becomes a cluster of its own and HDBSCAN runs on the remaining distinct rows.
    """
    n_unique = reduced.shape[0]
    raw = np.full(n_unique, -1, dtype=np.int64)
    params: dict[str, Any] = {"min_cluster_size": None, "min_samples": None, "algorithm": None, "n_piles": 0}
    if n_unique == 1:
        raw[:] = 0
        return raw.copy(), raw, f"all {n_total} examples have identical features: one cluster", params

    settings = config.cluster_settings
    pile_min = settings.resolved_min_cluster_size(n_total)
    piles = np.flatnonzero(counts >= pile_min) if counts.max() > 1 else np.zeros(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(n_unique), piles)
    params["n_piles"] = int(piles.size)
    requested = settings.hdbscan_min_cluster_size or AUTO_MIN_POINTS
    clusterer, n_found, fallback = None, 0, None
    if rest.size >= max(requested, 2):
        min_cluster_size = settings.resolved_min_cluster_size(rest.size)
        min_samples = max(1, min(settings.resolved_min_samples(), rest.size - 1))
        raw_rest, clusterer, single, algorithm = _run_hdbscan(reduced[rest], min_cluster_size, min_samples)
        params.update(
            min_cluster_size=min_cluster_size, min_samples=min_samples, algorithm=algorithm, allow_single_cluster=single
        )
        raw[rest] = raw_rest
        n_found = int(raw_rest.max()) + 1
        if single and n_found:
            fallback = "HDBSCAN labelled every point noise; refit with allow_single_cluster=True"
        elif not n_found:
            fallback = "HDBSCAN labelled every point noise, even with allow_single_cluster=True"
    elif rest.size:
        fallback = f"{rest.size} distinct rows outside duplicate piles, fewer than min_cluster_size={requested}"
    raw[piles] = n_found + np.arange(piles.size)
    n_clusters = n_found + piles.size
    if n_clusters == 0:
        return np.zeros(n_unique, dtype=np.int64), raw, f"{fallback}: one cluster", params
    labels = raw.copy()
    noise = raw < 0
    if noise.any():
        if settings.noise_policy == "own_cluster":
            labels[noise] = n_clusters
        elif n_found:
            labels[rest] = _assign_noise_by_membership(reduced[rest], raw[rest], clusterer, n_found)
        else:  # only piles: noise goes to the nearest pile
            labels[noise] = n_found + _centroid_assign(reduced[noise], reduced[piles])
    if fallback is not None and piles.size:
        fallback += f"; {piles.size} duplicate piles kept as clusters"
    return labels, raw, fallback, params



@CLUSTERERS.register("hdbscan", settings=HDBSCANSettings)
def fit_hdbscan(
    reduced: np.ndarray, counts: np.ndarray, inverse: np.ndarray, config: ClusterSelectConfig, world_size: int
) -> ClusterFit:
    """HDBSCAN on the distinct rows (see `clusterers.Clusterer`); noise resolved by its `noise_policy` setting."""
    labels_u, raw_u, fallback, params = _cluster_hdbscan(reduced, counts, int(inverse.size), config)
    return ClusterFit(labels_u[inverse], raw_u[inverse], fallback, params)
