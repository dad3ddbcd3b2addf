"""Clustering at scale (layer L2): fit on a seeded sample, then place every other row by nearest exemplar.

Exact HDBSCAN costs grow faster than linearly in the number of rows (on 2 CPU cores: about 25 s at 20k × 64 and
several minutes at 100k, `benchmarks/cluster_scale.py`), and KMeans with K = budget / 4 fine clusters costs n·K per
iteration. Above `ClusterSelectConfig.cluster_sample_size` distinct rows:

- `fit_on_sample`: any clusterer is fitted on a seeded uniform sample of the distinct rows (weighted by their
  counts), and each other row joins the cluster of its nearest exemplar — up to `EXEMPLARS_PER_CLUSTER` seeded
  members of each cluster of the sample — by a batched matrix product (squared Euclidean distance in the reduced
  space); the sample keeps its own labels. For HDBSCAN this is the nearest-exemplar counterpart of
  `hdbscan.approximate_predict` (which needs `prediction_data=True` and labels far points noise).
- `two_level_kmeans` (`fine_kmeans`): K = budget / `kept_per_cluster` clusters are found as ceil(√K) coarse KMeans
  clusters fitted on the sample, every row assigned to its nearest coarse centre, then KMeans inside each coarse
  group with its share of K (largest remainder, >= 1): cost about n·2√K per iteration instead of n·K. Above
  `MAX_BRANCH`² clusters, three levels (∛K coarse, then the same two levels inside each coarse group).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from ..clock import timed
from .quotas import cluster_quotas

EXEMPLARS_PER_CLUSTER = 64
MAX_BRANCH = 512  # two_level_kmeans: above MAX_BRANCH² fine clusters, a third level
BLOCK_ROWS = 8192  # rows per block of the distance matrix


def seeded_sample(n_rows: int, size: int | None, seed: int) -> np.ndarray | None:
    """Sorted seeded sample of `size` positions in `0..n_rows-1`, or `None` when `size` is None or >= `n_rows`."""
    if size is None or n_rows <= size:
        return None
    return np.sort(np.random.default_rng([seed, 11]).choice(n_rows, size=size, replace=False))


def nearest_labels(points: np.ndarray, exemplars: np.ndarray, exemplar_labels: np.ndarray,
                   block: int = BLOCK_ROWS) -> np.ndarray:
    """Label of the nearest exemplar (squared Euclidean distance) of every row of `points` `[n, d]`, computed in
    blocks of `block` rows by one matrix product each; ties go to the first exemplar. Returns int64 `[n]`."""
    exemplars = np.asarray(exemplars, dtype=np.float64)
    squared = (exemplars ** 2).sum(axis=1)
    out = np.empty(points.shape[0], dtype=np.int64)
    for start in range(0, points.shape[0], block):
        part = np.asarray(points[start: start + block], dtype=np.float64)
        distances = squared[None, :] - 2.0 * part @ exemplars.T  # + |x|^2, the same for every exemplar
        out[start: start + block] = exemplar_labels[np.argmin(distances, axis=1)]
    return out


def exemplars_of(points: np.ndarray, labels: np.ndarray, seed: int,
                 per_cluster: int = EXEMPLARS_PER_CLUSTER) -> tuple[np.ndarray, np.ndarray]:
    """Up to `per_cluster` seeded members of every cluster of `labels` (labels < 0 are skipped): `(rows, labels)`."""
    rng = np.random.default_rng([seed, 13])
    chosen = []
    for cluster in np.unique(labels[labels >= 0]):
        members = np.flatnonzero(labels == cluster)
        if members.size > per_cluster:
            members = rng.choice(members, size=per_cluster, replace=False)
        chosen.append(members)
    rows = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    return points[rows], labels[rows]


def fit_on_sample(fit: Callable, reduced: np.ndarray, counts: np.ndarray, inverse: np.ndarray, config: Any,
                  world_size: int, sample: np.ndarray):
    """Fit `fit` (a `Clusterer`) on the distinct rows `sample`, then place every other distinct row by nearest
    exemplar. Returns a `ClusterFit` over all `[n_examples]` rows with `params["sampled_rows"]` and
    `params["assign_seconds"]` (wall-clock seconds of the placement)."""
    from .clusterers import ClusterFit

    part = fit(reduced[sample], counts[sample], np.arange(sample.size), config, world_size)
    sample_labels = np.asarray(part.labels, dtype=np.int64)
    sample_raw = sample_labels if part.raw_labels is None else np.asarray(part.raw_labels, dtype=np.int64)
    began = time.perf_counter()
    labels_u = nearest_labels(reduced, *exemplars_of(reduced[sample], sample_labels, config.selection_seed))
    raw_u = labels_u.copy()
    labels_u[sample], raw_u[sample] = sample_labels, sample_raw
    params = dict(part.params, sampled_rows=int(sample.size), assignment="nearest_exemplar",
                  assign_seconds=time.perf_counter() - began)
    return ClusterFit(labels_u[inverse], raw_u[inverse], part.fallback, params)


def coarse_count(n_clusters: int) -> tuple[int, bool]:
    """Coarse groups for `n_clusters` fine ones and whether a third level is due: (ceil(√K), False) up to
    `MAX_BRANCH`² clusters, (ceil(∛K), True) above."""
    deep = n_clusters > MAX_BRANCH ** 2
    return math.ceil(n_clusters ** (1.0 / 3.0 if deep else 0.5)), deep


def split_group(points: np.ndarray, counts: np.ndarray, k: int, *, deep: bool, sample_size: int | None, seed: int,
                seconds: dict[str, float] | None = None) -> np.ndarray:
    """Fine labels `[n_rows]` in `0..k-1` of one coarse group's rows `points` (weighted by `counts`): one cluster
    for `k` = 1; with `deep` (three levels) and `k` above `MAX_BRANCH`, `two_level_kmeans` again on a seeded sample
    of `sample_size` of the rows; else seeded KMeans with `k` clusters."""
    from sklearn.cluster import KMeans

    if k == 1:
        return np.zeros(points.shape[0], dtype=np.int64)
    if deep and k > MAX_BRANCH and points.shape[0] > k:  # a third level (only above MAX_BRANCH² clusters in all)
        inner = seeded_sample(points.shape[0], sample_size, seed)
        return two_level_kmeans(points, counts, k, np.arange(points.shape[0]) if inner is None else inner, seed,
                                seconds)
    fine = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(points, sample_weight=counts.astype(np.float64))
    return np.asarray(fine.labels_, dtype=np.int64)


def two_level_kmeans(reduced: np.ndarray, counts: np.ndarray, n_clusters: int, sample: np.ndarray,
                     seed: int, seconds: dict[str, float] | None = None) -> np.ndarray:
    """Labels `[n_unique]` of about `n_clusters` KMeans clusters found coarse-then-fine (see the module doc); the
    wall-clock seconds of assigning rows to coarse centres are added to `seconds["assign"]`.

    Up to `MAX_BRANCH`² fine clusters: ceil(√K) coarse clusters fitted on `sample`, then KMeans inside each coarse
    group. Above (K > 262,144: about 2.6M rows at `data_fraction=0.3`), ceil(∛K) coarse clusters, and each coarse
    group whose share is above `MAX_BRANCH` is split the same way again (on a seeded sample of `sample.size` of its
    rows): three levels, so the fine fits cost about n·3∛K per iteration instead of n·2√K."""
    from sklearn.cluster import KMeans

    stage = {} if seconds is None else seconds
    n_coarse, deep = coarse_count(n_clusters)
    n_coarse = max(2, n_coarse)
    coarse = KMeans(n_clusters=n_coarse, n_init=1, random_state=seed)
    coarse.fit(reduced[sample], sample_weight=counts[sample].astype(np.float64))
    with timed(stage, "assign"):
        group = nearest_labels(reduced, coarse.cluster_centers_, np.arange(n_coarse))
    weights = np.bincount(group, weights=counts, minlength=n_coarse)
    present = np.flatnonzero(weights > 0)
    shares = cluster_quotas(weights[present].astype(np.int64), min(n_clusters, int(weights.sum())))
    by_group = np.argsort(group, kind="stable")  # each group's rows in order, without a pass over n per group
    sizes = np.bincount(group, minlength=n_coarse)
    ends = np.cumsum(sizes)
    labels = np.empty(reduced.shape[0], dtype=np.int64)
    offset = 0
    for g, share in zip(present, shares):
        rows = by_group[ends[g] - sizes[g]: ends[g]]
        k = int(max(1, min(share, rows.size)))
        labels[rows] = offset + split_group(reduced[rows], counts[rows], k, deep=deep, sample_size=sample.size,
                                            seed=seed, seconds=stage)
        offset += k
    return labels
