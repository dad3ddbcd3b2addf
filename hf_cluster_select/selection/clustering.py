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

import time
from typing import Any

import numpy as np

from .._types import NO_LOSS_LABEL, NONFINITE_LABEL, ClusteringResult
from ..clock import timed
from ..config import ClusterSelectConfig
from . import hdbscan_clusterer, kmeans_clusterer  # noqa: F401  (register the built-in clusterers)
from .clusterers import CLUSTERERS
from .duplicates import cell_codes, duplicate_groups
from .sampled import fit_on_sample, seeded_sample



LARGE_INPUT_BYTES = 1 << 31  # a float64 copy above 2 GiB: rows are read in blocks (a memory-mapped matrix stays on disk)
BLOCK_ROWS = 16384
BLOCKWISE_FIT_ROWS = 20000  # PCA sample of a blockwise (memory-mapped) matrix when cluster_sample_size is None


def _read_in_blocks(x: np.ndarray) -> bool:
    """Whether `cluster_features` reads the float matrix `x` block by block (`_distinct_rows_blockwise`) instead of
    copying it to float64: when that copy would exceed `LARGE_INPUT_BYTES` (8 bytes per value), whether `x` is in
    memory or memory-mapped (then it stays on disk)."""
    return x.dtype in (np.float32, np.float64) and x.shape[0] * x.shape[1] * 8 > LARGE_INPUT_BYTES


def _as_float_matrix(features: Any) -> np.ndarray:
    """`features` as a float64 `[n, dim]` array, validated (NaN/inf are allowed here; see `_screen_rows`); when its
    float64 copy would exceed `LARGE_INPUT_BYTES` (`_read_in_blocks`), the float array itself (no copy: it is read
    in blocks)."""
    if hasattr(features, "detach"):  # torch.Tensor, without importing torch
        features = features.detach().cpu()
        features = features.numpy() if features.dtype.is_floating_point and features.dtype.itemsize >= 4 \
            else features.double().numpy()
    array = np.asarray(features)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise ValueError(f"`features` must hold numbers, got dtype {array.dtype}.")
    if array.ndim != 2:
        raise ValueError(f"`features` must be 2-D `[n_examples, dim]`, got shape {tuple(array.shape)}.")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"`features` must have at least one example and one dimension, got shape {array.shape}.")
    if _read_in_blocks(array):
        return array
    return array.astype(np.float64)


def _screen_rows(x: np.ndarray, loss_tokens: Any) -> np.ndarray:
    """Status of every row: 0 = clusterable, `NO_LOSS_LABEL` (no loss-bearing token; takes precedence) or
    `NONFINITE_LABEL` (a NaN/inf value)."""
    finite = np.concatenate([np.isfinite(x[s: s + BLOCK_ROWS]).all(axis=1) for s in range(0, x.shape[0], BLOCK_ROWS)])
    status = np.where(finite, 0, NONFINITE_LABEL).astype(np.int64)
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


def _pca(unique_rows: np.ndarray, pca_dim: int | None, seed: int,
         sample: np.ndarray | None = None) -> tuple[np.ndarray, int | None]:
    """Seeded PCA of the distinct rows (fitted on `sample` of them when given) to min(pca_dim, n_fit − 1, dim);
    returns (reduced float64, dim used)."""
    n_unique, dim = unique_rows.shape
    if pca_dim is None or n_unique < 2:
        return unique_rows, None
    from sklearn.decomposition import PCA

    fit_rows = unique_rows if sample is None else unique_rows[sample]
    n_components = min(pca_dim, fit_rows.shape[0] - 1, dim)
    pca = PCA(n_components=n_components, svd_solver="auto", random_state=seed).fit(fit_rows)
    return np.ascontiguousarray(pca.transform(unique_rows), dtype=np.float64), n_components


def cluster_features(
    features: Any,
    config: ClusterSelectConfig,
    *,
    world_size: int = 1,
    loss_tokens: Any = None,
    merge_unclusterable: bool = False,
) -> ClusteringResult:
    """Partition examples by their learning-effect features.

    Rows are L2-normalised (zero rows stay zero), identical rows are merged (they share a label), and the distinct
    rows are reduced by a seeded PCA to `min(pca_dim, n_unique − 1, dim)` dimensions. Then the clusterer registered
    as `config.cluster_method` partitions them with its settings (`config.cluster_settings`): `fine_kmeans` (default;
    K = ceil(budget / `kept_per_cluster`), `kmeans_clusterer.py`), `hdbscan` (noise assigned to its most probable
    cluster or kept as one group, `hdbscan_clusterer.py`), `kmeans` (CluSTER's K and size cap).

    Above `cluster_sample_size` distinct rows, PCA and the clusterer are fitted on a seeded sample and the
    other rows join the cluster of their nearest exemplar (`sampled.py`; `params["sampled_rows"]`); `fine_kmeans`
    then runs coarse-then-fine KMeans instead.

    Degenerate inputs (all noise, one distinct row) yield one cluster and a `fallback` note, not an error; the result
    is deterministic for a given `config.selection_seed`.

    Rows that cannot be clustered are screened out first and never dropped: a row holding NaN/inf (raw label
    `NONFINITE_LABEL` = -2) and, when `loss_tokens` is given, an example with 0 loss-bearing tokens (raw label
    `NO_LOSS_LABEL` = -3; its feature is a zero vector that means nothing). Each kind forms one extra group after
    the clusters (`labels` K, K+1), or joins the smallest cluster with `merge_unclusterable=True` (for an allocation
    that needs exactly the clusters found: CluSTER's). Their `reduced` rows are zeros; `fallback` says how many there
    were and `params` counts them (`n_nonfinite_features`, `n_no_loss_tokens`). `selection.select_subset` keeps the
    non-finite group like any cluster and keeps no-loss examples only when the budget cannot be filled without them.

    Args:
        features (`np.ndarray` or `torch.Tensor` of shape `[n_examples, dim]`): per-example feature vectors.
        config (`ClusterSelectConfig`): `cluster_method`, its `cluster_settings` and `selection_seed`.
        world_size (`int`, *optional*, defaults to `1`): number of data-parallel ranks (KMeans' default K).
        loss_tokens (array-like of shape `[n_examples]`, int, *optional*): loss-bearing tokens of every example
            (`FeatureOutput.loss_tokens`); examples with 0 are kept out of clustering.
    Returns:
        `ClusteringResult`: `labels` `[n_examples]` in `0..K-1`, HDBSCAN's `raw_labels` (-1 = noise, -2 / -3 =
        screened out; for KMeans equal to `labels` elsewhere), float32 `reduced` `[n_examples, reduced_dim]`, and
        `params` with the resolved `min_cluster_size`, `min_samples`, `pca_dim`, `n_unique` (of the clustered rows),
        `n_nonfinite_features`, `n_no_loss_tokens`, `seconds` (wall-clock, in all) and `stage_seconds` (wall-clock
        seconds per stage: `screen` (reading and checking the rows), `dedup` (L2 normalisation and merging
        identical rows), `pca` (sampling and PCA), `fit` (the clusterer on the rows or its sample), `assign`
        (placing the other rows: nearest exemplar, nearest centre or the size cap; only where the clusterer reports
        it), `outputs` (the full-size labels, reduced rows and groups)).
    Raises:
        ValueError: if `features` is not 2-D or is empty, `loss_tokens` does not hold one count per row, or
            `world_size` < 1.
        ImportError: if `cluster_method="hdbscan"` and the `hdbscan` package cannot be imported.
    """
    start = time.perf_counter()
    if not isinstance(config, ClusterSelectConfig):
        raise TypeError(f"`config` must be a ClusterSelectConfig, got {type(config).__name__}.")
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"`world_size` must be an int >= 1, got {world_size!r}.")
    stages: dict[str, float] = {}
    with timed(stages, "screen"):
        x = _as_float_matrix(features)
        status = _screen_rows(x, loss_tokens)
        usable = np.flatnonzero(status == 0)
    if usable.size:
        distinct = _distinct_rows_blockwise if _read_in_blocks(x) else _distinct_rows
        labels_u, raw_u, reduced_u, groups_u, fallback, params = _cluster_rows(x, usable, distinct, config,
                                                                               int(world_size), stages)
    else:
        labels_u, raw_u, reduced_u = (np.zeros(0, dtype=np.int64),) * 2 + (np.zeros((0, 1)),)
        groups_u = np.zeros(0, dtype=np.int64)
        fallback, params = "no example has finite features and loss-bearing tokens", {"pca_dim": None, "n_unique": 0}
    with timed(stages, "outputs"):
        labels, raw_labels, reduced, notes = _place_unclustered(status, usable, labels_u, raw_u, reduced_u,
                                                                merge_unclusterable)
        reduced, groups = reduced.astype(np.float32), _all_groups(status, usable, groups_u)
    if notes:
        fallback = "; ".join(([fallback] if fallback else []) + notes)
    params["n_nonfinite_features"] = int((status == NONFINITE_LABEL).sum())
    params["n_no_loss_tokens"] = int((status == NO_LOSS_LABEL).sum())
    params["stage_seconds"] = stages
    params["seconds"] = time.perf_counter() - start
    return ClusteringResult(labels=labels, raw_labels=raw_labels, reduced=reduced,
                            n_clusters=int(labels.max()) + 1, method=config.cluster_method, fallback=fallback,
                            params=params, groups=groups)


def _all_groups(status: np.ndarray, usable: np.ndarray, groups_u: np.ndarray) -> np.ndarray:
    """Duplicate group of every row `[n]`: the clustered rows' groups, and a group of its own per screened-out row."""
    groups = np.empty(status.size, dtype=np.int64)
    groups[usable] = groups_u
    screened = np.flatnonzero(status != 0)
    groups[screened] = (groups_u.max() + 1 if groups_u.size else 0) + np.arange(screened.size)
    return groups


def _place_unclustered(
    status: np.ndarray, usable: np.ndarray, labels_u: np.ndarray, raw_u: np.ndarray, reduced_u: np.ndarray,
    merge: bool,
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
        if merge and n_clusters:  # the allocation needs exactly the clusters found (CluSTER: one per rank)
            labels[rows], where = smallest, f"joined the smallest cluster ({smallest})"
        else:
            labels[rows], where = n_clusters, f"form group {n_clusters} of their own"
            n_clusters += 1
        notes.append(f"{int(rows.sum())} examples with {what} were kept out of clustering and {where}")
    return labels, raw, reduced, notes


def _distinct_rows(x: np.ndarray, usable: np.ndarray, config: ClusterSelectConfig, stages: dict[str, float]):
    """L2-normalised rows `x[usable]` with near-duplicates merged (`duplicates.py`: directions equal to about 1e-5,
    whatever the rows' scale; exact duplicates make HDBSCAN's lambdas infinite) and reduced by PCA: (reduced float64
    `[n_unique, d]`, counts, inverse `[n_usable]`, sample of the distinct rows the fits use or `None`, PCA dimension
    used). Each group is represented by its first row; the seconds of `dedup` and `pca` go to `stages`."""
    with timed(stages, "dedup"):
        rows = _l2_normalise(x[usable])
        inverse, first, counts = duplicate_groups([cell_codes(rows)])
        unique_rows = rows[first]
    with timed(stages, "pca"):
        settings = config.cluster_settings
        sample = seeded_sample(unique_rows.shape[0], settings.cluster_sample_size, config.selection_seed)
        reduced, pca_used = _pca(unique_rows.astype(np.float64), settings.pca_dim, config.selection_seed, sample)
    return reduced, counts, inverse, sample, pca_used


def _distinct_rows_blockwise(x: np.ndarray, usable: np.ndarray, config: ClusterSelectConfig,
                             stages: dict[str, float]):
    """`_distinct_rows` for a matrix whose float64 copy would exceed `LARGE_INPUT_BYTES` (`_read_in_blocks`; e.g.
    memory-mapped): rows are read, normalised and snapped to the duplicate grids `BLOCK_ROWS` at a time, PCA is
    fitted on a seeded sample of the distinct rows (at most `cluster_sample_size`, else `BLOCKWISE_FIT_ROWS`) and
    applied block by block, so only the reduced `[n_unique, pca_dim]` matrix is held in memory."""

    def normalised(positions: np.ndarray) -> np.ndarray:
        return _l2_normalise(np.asarray(x[usable[positions]], dtype=np.float64))

    with timed(stages, "dedup"):
        inverse, first, counts = duplicate_groups(
            cell_codes(normalised(np.arange(start, min(start + BLOCK_ROWS, usable.size))))
            for start in range(0, usable.size, BLOCK_ROWS))
    settings = config.cluster_settings
    sample = seeded_sample(first.size, settings.cluster_sample_size or BLOCKWISE_FIT_ROWS, config.selection_seed)
    fit_positions = first if sample is None else first[sample]
    if settings.pca_dim is None or first.size < 2:
        with timed(stages, "pca"):
            return normalised(first), counts, inverse, sample, None
    from sklearn.decomposition import PCA

    with timed(stages, "pca"):
        n_components = min(settings.pca_dim, fit_positions.size - 1, x.shape[1])
        pca = PCA(n_components=n_components, random_state=config.selection_seed).fit(
            normalised(np.sort(fit_positions)))
        reduced = np.concatenate([pca.transform(normalised(first[s: s + BLOCK_ROWS]))
                                  for s in range(0, first.size, BLOCK_ROWS)])
    return np.ascontiguousarray(reduced, dtype=np.float64), counts, inverse, sample, n_components


def _cluster_rows(
    x: np.ndarray, usable: np.ndarray, distinct, config: ClusterSelectConfig, world_size: int,
    stages: dict[str, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str | None, dict[str, Any]]:
    """Cluster the finite rows `x[usable]` (normalised, merged and reduced by `distinct`), adding the seconds of
    `dedup`, `pca`, `fit` and `assign` to `stages` (`assign`: what the clusterer reports as `assign_seconds`, the
    rest of its call is `fit`).

    Returns:
        (labels `[n]` in 0..K-1, raw labels `[n]`, reduced float64 `[n, d]`, distinct-row id `[n]`, fallback note or
        `None`, params).
    """
    reduced, counts, inverse, sample, pca_used = distinct(x, usable, config, stages)
    params: dict[str, Any] = {"pca_dim": pca_used, "n_unique": int(reduced.shape[0])}
    clusterer = CLUSTERERS.get(config.cluster_method)
    began = time.perf_counter()
    if sample is None or getattr(clusterer, "handles_scale", False):
        fit = clusterer(reduced, counts, inverse, config, world_size)
    else:  # fit on a seeded sample, nearest exemplar for the rest (sampled.py)
        fit = fit_on_sample(clusterer, reduced, counts, inverse, config, world_size, sample)
    labels, raw_labels, fallback, extra = fit.labels, fit.raw_labels, fit.fallback, dict(fit.params)
    assign = extra.pop("assign_seconds", None)
    stages["fit"] = time.perf_counter() - began - (assign or 0.0)
    if assign is not None:
        stages["assign"] = float(assign)
    # Contiguous 0..K-1, keeping the clusterer's order.
    _, labels = np.unique(labels, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    if raw_labels is None:
        raw_labels = labels.copy()
    params.update(extra)
    return labels, raw_labels.astype(np.int64), reduced[inverse], inverse.astype(np.int64), fallback, params
