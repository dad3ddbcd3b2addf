"""Clustering of per-example learning-effect features (layer L2: pure functions over arrays).

`cluster_features` L2-normalises the features, merges identical rows, reduces them with PCA and partitions them with
HDBSCAN (Campello, Moulavi & Sander, PAKDD 2013; the `hdbscan` package of McInnes, Healy & Astels, JOSS 2017), or with
KMeans capped in cluster size as in CluSTER (Kim et al., EMNLP 2026). Whatever the input, it returns a partition with
contiguous labels `0..K-1` and no empty cluster; degenerate inputs are repaired and the repair is named in
`ClusteringResult.fallback`. Rows that cannot be clustered — non-finite features (NaN/inf, e.g. an fp16 overflow) and
examples without any loss-bearing token — are kept out of clustering but never dropped: each kind forms a group of
its own (see `cluster_features`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ._imports import require_hdbscan
from ._types import NO_LOSS_LABEL, NONFINITE_LABEL, ClusteringResult
from .config import ClusterSelectConfig

# HDBSCAN's `algorithm="generic"` (a dense float64 distance matrix, n² · 8 bytes) beat the tree algorithms on
# high-dimensional data (5,000 × 128: 1.5 s vs 2.4 s for prims_kdtree) but lost at ≤ 64 dims (5,000 × 16: 1.7 s vs
# 0.4 s). prims_kdtree beat boruvka_kdtree at every size measured up to 50,000 × 16 on one core.
GENERIC_MIN_DIM = 65
GENERIC_MAX_POINTS = 5000
# Fewer distinct rows than this (with an automatic min_cluster_size) are not worth clustering: one cluster.
AUTO_MIN_POINTS = 5


def _as_float_matrix(features: Any) -> np.ndarray:
    """`features` as a float64 `[n, dim]` array, validated (NaN/inf are allowed here; see `_screen_rows`)."""
    if hasattr(features, "detach"):  # torch.Tensor, without importing torch
        features = features.detach().cpu().double().numpy()
    array = np.asarray(features)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise ValueError(f"`features` must hold numbers, got dtype {array.dtype}.")
    if array.ndim != 2:
        raise ValueError(f"`features` must be 2-D `[n_examples, dim]`, got shape {tuple(array.shape)}.")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"`features` must have at least one example and one dimension, got shape {array.shape}.")
    return array.astype(np.float64)


def _screen_rows(x: np.ndarray, loss_tokens: Any) -> np.ndarray:
    """Status of every row: 0 = clusterable, `NO_LOSS_LABEL` (no loss-bearing token; takes precedence) or
    `NONFINITE_LABEL` (a NaN/inf value)."""
    status = np.where(np.isfinite(x).all(axis=1), 0, NONFINITE_LABEL).astype(np.int64)
    if loss_tokens is not None:
        if hasattr(loss_tokens, "detach"):
            loss_tokens = loss_tokens.detach().cpu().numpy()
        tokens = np.asarray(loss_tokens).reshape(-1) if np.ndim(loss_tokens) else np.asarray([loss_tokens])
        if tokens.shape[0] != x.shape[0] or not np.issubdtype(tokens.dtype, np.number) or (tokens < 0).any():
            raise ValueError(
                f"`loss_tokens` must hold {x.shape[0]} non-negative counts (one per example), got shape "
                f"{tuple(tokens.shape)}, dtype {tokens.dtype}."
            )
        status[tokens == 0] = NO_LOSS_LABEL
    return status


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def _pca(unique_rows: np.ndarray, pca_dim: int | None, seed: int) -> tuple[np.ndarray, int | None]:
    """Seeded PCA of the distinct rows to min(pca_dim, n_unique − 1, dim); returns (reduced float64, dim used)."""
    n_unique, dim = unique_rows.shape
    if pca_dim is None or n_unique < 2:
        return unique_rows, None
    from sklearn.decomposition import PCA

    n_components = min(pca_dim, n_unique - 1, dim)
    reduced = PCA(n_components=n_components, svd_solver="auto", random_state=seed).fit_transform(unique_rows)
    return np.ascontiguousarray(reduced, dtype=np.float64), n_components


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

    pile_min = config.resolved_min_cluster_size(n_total)
    piles = np.flatnonzero(counts >= pile_min) if counts.max() > 1 else np.zeros(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(n_unique), piles)
    params["n_piles"] = int(piles.size)
    requested = config.hdbscan_min_cluster_size or AUTO_MIN_POINTS
    clusterer, n_found, fallback = None, 0, None
    if rest.size >= max(requested, 2):
        min_cluster_size = config.resolved_min_cluster_size(rest.size)
        min_samples = max(1, min(config.resolved_min_samples(), rest.size - 1))
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
        if config.noise_policy == "own_cluster":
            labels[noise] = n_clusters
        elif n_found:
            labels[rest] = _assign_noise_by_membership(reduced[rest], raw[rest], clusterer, n_found)
        else:  # only piles: noise goes to the nearest pile
            labels[noise] = n_found + _centroid_assign(reduced[noise], reduced[piles])
    if fallback is not None and piles.size:
        fallback += f"; {piles.size} duplicate piles kept as clusters"
    return labels, raw, fallback, params


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

    n_total, n_unique = inverse.size, reduced.shape[0]
    requested = config.kmeans_n_clusters or max(2, world_size)
    n_clusters = min(requested, n_unique)
    params: dict[str, Any] = {"n_clusters_requested": requested, "size_cap_examples": None}
    fallback = None
    if n_clusters < requested:
        fallback = f"only {n_unique} distinct feature rows: K clipped from {requested} to {n_clusters}"
    if n_clusters == 1:
        return np.zeros(n_total, dtype=np.int64), fallback, params
    kmeans = KMeans(n_clusters=n_clusters, n_init=10, random_state=config.seed)
    kmeans.fit(reduced, sample_weight=counts.astype(np.float64))
    if config.kmeans_size_cap is None:
        return np.asarray(kmeans.labels_, dtype=np.int64)[inverse], fallback, params
    capacity = math.ceil(round(float(config.kmeans_size_cap) * n_total / n_clusters, 9))
    params["size_cap_examples"] = capacity
    return _capacity_assign(reduced[inverse], kmeans.cluster_centers_, capacity), fallback, params


def cluster_features(
    features: Any, config: ClusterSelectConfig, *, world_size: int = 1, loss_tokens: Any = None
) -> ClusteringResult:
    """Partition examples by their learning-effect features.

    Rows are L2-normalised (zero rows stay zero), identical rows are merged (they share a label), and the distinct
    rows are reduced by a seeded PCA to `min(config.pca_dim, n_unique − 1, dim)` dimensions. Then either:

    - `cluster_method="hdbscan"` (default): HDBSCAN (Campello et al. 2013) with
      `min_cluster_size=config.resolved_min_cluster_size(n_unique)` and `min_samples=config.resolved_min_samples()`.
      Noise points (label -1) get their most probable cluster (`noise_policy="assign"`, argmax of
      `hdbscan.all_points_membership_vectors`) or form one extra cluster (`"own_cluster"`). A row repeated at least
      `resolved_min_cluster_size(n)` times forms its own cluster.
    - `cluster_method="kmeans"` (CluSTER, Kim et al., EMNLP 2026): K = `config.kmeans_n_clusters` or
      `max(2, world_size)`, clipped to the number of distinct rows; with `config.kmeans_size_cap` c no cluster holds
      more than `ceil(c · n / K)` examples (capacity-constrained nearest-centroid assignment).

    Degenerate inputs (all noise, one distinct row, fewer distinct rows than `min_cluster_size`) yield one cluster
    and a `fallback` note instead of an error. The result is deterministic for a given `config.seed`.

    Rows that cannot be clustered are screened out first and never dropped: a row holding NaN/inf (raw label
    `NONFINITE_LABEL` = -2) and, when `loss_tokens` is given, an example with 0 loss-bearing tokens (raw label
    `NO_LOSS_LABEL` = -3; its feature is a zero vector that means nothing). Each kind forms one extra group after
    the clusters (`labels` K, K+1), or joins the smallest cluster when `config.allocation == "paper"` (CluSTER's
    allocation needs exactly one cluster per rank). Their `reduced` rows are zeros; `fallback` says how many there
    were and `params` counts them (`n_nonfinite_features`, `n_no_loss_tokens`). `selection.select_subset` keeps the
    non-finite group like any cluster and keeps no-loss examples only when the budget cannot be filled without them.

    Args:
        features (`np.ndarray` or `torch.Tensor` of shape `[n_examples, dim]`): per-example feature vectors.
        config (`ClusterSelectConfig`): clustering settings (`cluster_method`, `pca_dim`, `hdbscan_*`,
            `noise_policy`, `kmeans_*`, `seed`).
        world_size (`int`, *optional*, defaults to `1`): number of data-parallel ranks (KMeans' default K).
        loss_tokens (array-like of shape `[n_examples]`, int, *optional*): loss-bearing tokens of every example
            (`FeatureOutput.loss_tokens`); examples with 0 are kept out of clustering.
    Returns:
        `ClusteringResult`: `labels` `[n_examples]` in `0..K-1`, HDBSCAN's `raw_labels` (-1 = noise, -2 / -3 =
        screened out; for KMeans equal to `labels` elsewhere), float32 `reduced` `[n_examples, reduced_dim]`, and
        `params` with the resolved `min_cluster_size`, `min_samples`, `pca_dim`, `n_unique` (of the clustered rows),
        `n_nonfinite_features`, `n_no_loss_tokens` and `seconds` (wall-clock).
    Raises:
        ValueError: if `features` is not 2-D or is empty, `loss_tokens` does not hold one count per row, or
            `world_size` < 1.
        ImportError: if `cluster_method="hdbscan"` and the `hdbscan` package cannot be imported.
    """
    start = time.perf_counter()
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"`world_size` must be an int >= 1, got {world_size!r}.")
    x = _as_float_matrix(features)
    status = _screen_rows(x, loss_tokens)
    usable = np.flatnonzero(status == 0)
    if usable.size:
        labels_u, raw_u, reduced_u, fallback, params = _cluster_rows(_l2_normalise(x[usable]), config, int(world_size))
    else:
        labels_u, raw_u, reduced_u = (np.zeros(0, dtype=np.int64),) * 2 + (np.zeros((0, 1)),)
        fallback, params = "no example has finite features and loss-bearing tokens", {"pca_dim": None, "n_unique": 0}
    labels, raw_labels, reduced, notes = _place_unclustered(status, usable, labels_u, raw_u, reduced_u, config)
    if notes:
        fallback = "; ".join(([fallback] if fallback else []) + notes)
    params["n_nonfinite_features"] = int((status == NONFINITE_LABEL).sum())
    params["n_no_loss_tokens"] = int((status == NO_LOSS_LABEL).sum())
    params["seconds"] = time.perf_counter() - start
    return ClusteringResult(
        labels=labels,
        raw_labels=raw_labels,
        reduced=reduced.astype(np.float32),
        n_clusters=int(labels.max()) + 1,
        method=config.cluster_method,
        fallback=fallback,
        params=params,
    )


def _place_unclustered(
    status: np.ndarray, usable: np.ndarray, labels_u: np.ndarray, raw_u: np.ndarray, reduced_u: np.ndarray,
    config: ClusterSelectConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Full-size labels, raw labels and reduced rows (zeros for unclustered rows), and notes on the placement."""
    n_total = status.size
    labels, raw = np.zeros(n_total, dtype=np.int64), status.copy()
    reduced = np.zeros((n_total, reduced_u.shape[1]), dtype=np.float64)
    labels[usable], raw[usable], reduced[usable] = labels_u, raw_u, reduced_u
    n_clusters = int(labels_u.max()) + 1 if usable.size else 0
    smallest = int(np.argmin(np.bincount(labels_u, minlength=n_clusters))) if n_clusters else 0
    notes = []
    for kind, what in ((NONFINITE_LABEL, "non-finite (NaN/inf) features"), (NO_LOSS_LABEL, "no loss-bearing token")):
        rows = status == kind
        if not rows.any():
            continue
        if config.allocation == "paper" and n_clusters:  # CluSTER's allocation needs exactly K clusters
            labels[rows], where = smallest, f"joined the smallest cluster ({smallest}; allocation='paper')"
        else:
            labels[rows], where = n_clusters, f"form group {n_clusters} of their own"
            n_clusters += 1
        notes.append(f"{int(rows.sum())} examples with {what} were kept out of clustering and {where}")
    return labels, raw, reduced, notes


def _cluster_rows(
    x: np.ndarray, config: ClusterSelectConfig, world_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None, dict[str, Any]]:
    """Cluster L2-normalised finite rows `x` `[n, dim]`.

    Returns:
        (labels `[n]` in 0..K-1, raw labels `[n]`, reduced float64 `[n, d]`, fallback note or `None`, params).
    """
    n_total = x.shape[0]
    # Merge rows equal to float32 precision: exact duplicates make HDBSCAN's lambdas infinite.
    unique_rows, inverse, counts = np.unique(x.astype(np.float32), axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    reduced, pca_used = _pca(unique_rows.astype(np.float64), config.pca_dim, config.seed)
    params: dict[str, Any] = {"pca_dim": pca_used, "n_unique": int(unique_rows.shape[0])}
    if config.cluster_method == "kmeans":
        labels, fallback, extra = _cluster_kmeans(reduced, counts, inverse, config, world_size)
        raw_labels = None
    else:
        labels_u, raw_u, fallback, extra = _cluster_hdbscan(reduced, counts, n_total, config)
        labels, raw_labels = labels_u[inverse], raw_u[inverse]
    # Contiguous 0..K-1, keeping the clusterer's order.
    _, labels = np.unique(labels, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    if raw_labels is None:
        raw_labels = labels.copy()
    params.update(extra)
    return labels, raw_labels.astype(np.int64), reduced[inverse], fallback, params
