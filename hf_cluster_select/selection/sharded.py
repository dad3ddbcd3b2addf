"""Selection sharded across ranks: no rank holds more feature rows than its shard plus the fit sample (layer L2).

`select_sharded` is the `fine_kmeans` selection (K = budget / `kept_per_cluster`, coarse-then-fine KMeans, then the
within-cluster rule) for pools whose features do not fit one process, laid out so that every step is either a fit on
a seeded sample or a pass over one rank's rows:

1. every rank screens (NaN/inf, no loss-bearing token) and L2-normalises its own rows and computes their
   duplicate-grid cells (`duplicates.cell_codes`);
2. the rows at the seeded sample's dataset indices (`cluster_sample_size`, drawn over `range(n_examples)`) are
   gathered to rank 0, which fits the PCA and ceil(√K) coarse KMeans centres (∛K above `MAX_BRANCH`² clusters) and
   broadcasts them (`[pca_dim, dim]` and `[n_coarse, pca_dim]` floats);
3. every rank projects its rows and assigns each to its nearest coarse centre;
4. each coarse group goes to one owner rank (largest groups first, to the least loaded rank) and every row is sent
   to its group's owner with its index, cells, norm and loss (point-to-point: only reduced `[n, pca_dim]` rows
   travel, never the raw features); the rank then drops its own rows;
5. each owner merges duplicates inside its groups (identical cells: exact and near copies always share a coarse
   group), fits the fine KMeans with the group's share of K, and applies the within-cluster rule with the quotas
   that every rank computes from the all-reduced cluster sizes (`quotas.cluster_quotas`);
6. the kept indices and weights (`[m]` each) are all-gathered: every rank returns the same `Selection`.

The result does not depend on the world size (the same sample, the same rows per group in dataset order, the same
seeds; tested bit-for-bit with 1, 2 and 4 gloo ranks). It is not the one-process `cluster_features` +
`select_subset` result: that fits the PCA and the coarse centres on a sample of the *distinct* rows of the whole
pool, which no rank sees here; both are seeded KMeans partitions of the same budget and equally homogeneous on the
benchmark mixture (docs/distributed.md, "Pools larger than one machine").
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .. import distributed
from .._types import ClusteringResult, Selection
from ..clock import timed
from ..config import ClusterSelectConfig
from .kmeans_clusterer import requested_clusters
from .duplicates import cell_codes
from .clustering import _l2_normalise
from .sampled import coarse_count, nearest_labels, seeded_sample
from .sharded_owner import all_sum_array, clustering_of, route_rows, select_routed

BLOCK_ROWS = 16384


def _local_arrays(local_features: Any, local_indices: Sequence[int], n_examples: int, loss_tokens: Any,
                  norms: Any, losses: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                                      np.ndarray | None]:
    """This rank's inputs, checked: features `[n_local, dim]` (not copied), indices int64, a deferred mask, and the
    per-row norms/losses as float64 (or `None`)."""
    if hasattr(local_features, "detach"):
        local_features = local_features.detach().cpu().numpy()
    x = np.asarray(local_features)
    if x.ndim != 2 or x.shape[1] == 0 or not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"`local_features` must be a numeric `[n_local, dim]` array, got shape {x.shape}, "
                         f"dtype {x.dtype}.")
    index = np.asarray(local_indices)
    if index.ndim != 1 or not (np.issubdtype(index.dtype, np.integer) or index.size == 0):
        raise ValueError(f"`local_indices` must be a 1-D sequence of ints, got shape {index.shape}, "
                         f"dtype {index.dtype}.")
    index = index.astype(np.int64)
    if index.shape != (x.shape[0],):
        raise ValueError(f"`local_indices` has {index.size} entries but `local_features` has {x.shape[0]} rows.")
    if isinstance(n_examples, bool) or not isinstance(n_examples, (int, np.integer)) or n_examples < 1:
        raise ValueError(f"`n_examples` must be an int >= 1, got {n_examples!r}.")
    if index.size and (index.min() < 0 or index.max() >= n_examples or np.unique(index).size != index.size):
        raise ValueError(f"`local_indices` must be distinct dataset indices in [0, {n_examples}).")
    deferred = np.zeros(index.size, dtype=bool)
    if loss_tokens is not None:
        tokens = np.asarray(loss_tokens.detach().cpu() if hasattr(loss_tokens, "detach") else loss_tokens)
        if tokens.reshape(-1).shape != (index.size,):
            raise ValueError(f"`loss_tokens` must hold one count per local row ({index.size}), got {tokens.shape}.")
        deferred = tokens.reshape(-1) == 0
    extras = []
    for name, values in (("norms", norms), ("losses", losses)):
        if values is None:
            extras.append(None)
            continue
        array = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
        if array.reshape(-1).shape != (index.size,):
            raise ValueError(f"`{name}` must hold one value per local row ({index.size}), got {array.shape}.")
        array = array.reshape(-1)  # losses keep their non-finite entries: `_agreed_inputs` fills them
        extras.append(array if name == "losses" else np.nan_to_num(array, nan=0.0, posinf=0.0, neginf=0.0))
    return x, index, deferred, extras[0], extras[1]


def _agreed_inputs(local_features: Any, local_indices: Any, n_examples: Any, config: ClusterSelectConfig,
                   loss_tokens: Any, norms: Any, losses: Any):
    """`_local_arrays` on every rank, then one all-gather of each rank's verdict, `n_examples` and settings: a bad
    input on any rank, or ranks that disagree, raise the same `ValueError` on every rank (never a hang). A
    non-finite loss becomes the highest finite loss over all ranks, as `select_subset` fills it in one process."""
    try:
        arrays, problem = _local_arrays(local_features, local_indices, n_examples, loss_tokens, norms, losses), None
    except ValueError as error:
        arrays, problem = None, str(error)
    local = None if arrays is None or arrays[4] is None else arrays[4][np.isfinite(arrays[4])]
    verdicts = distributed.gather_objects((problem, repr(n_examples), repr(config.to_dict()),
                                           (norms is None, losses is None),
                                           float(local.max()) if local is not None and local.size else None))
    bad = [(r, v[0]) for r, v in enumerate(verdicts) if v[0] is not None]
    if bad:
        raise ValueError(f"select_sharded: rank {bad[0][0]}: {bad[0][1]}")
    for position, what in ((1, "`n_examples`"), (2, "`config`"), (3, "`norms` / `losses` given or not")):
        if len({v[position] for v in verdicts}) > 1:
            raise ValueError(f"select_sharded: every rank must pass the same {what}; the ranks differ.")
    if arrays[4] is not None:
        top = max((v[4] for v in verdicts if v[4] is not None), default=0.0)
        arrays = (*arrays[:4], np.where(np.isfinite(arrays[4]), arrays[4], top))
    return arrays


def _index_hash(index: np.ndarray) -> int:
    """Sum over `index` of a 64-bit mix of each index, wrapping: equal over all ranks to the one of
    `range(n_examples)` when the ranks' indices cover it exactly once (an overlap or a gap changes it, except with
    probability about 2^-64)."""
    total = np.int64(0)
    with np.errstate(over="ignore"):
        for start in range(0, index.size, 1 << 20):
            mixed = index[start: start + (1 << 20)].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            mixed ^= mixed >> np.uint64(31)
            mixed *= np.uint64(0xBF58476D1CE4E5B9)
            mixed ^= mixed >> np.uint64(29)
            total = total + mixed.view(np.int64).sum(dtype=np.int64)
    return int(total)


def _normalised(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """L2-normalised float64 copy of `x[rows]` (zero rows stay zero)."""
    return _l2_normalise(np.asarray(x[rows], dtype=np.float64))


def _fit_projection(sample_rows: np.ndarray, config: ClusterSelectConfig, n_clusters: int):
    """Rank 0: (PCA mean `[dim]`, components `[d, dim]` or `None`, coarse centres `[n_coarse, d]`) fitted on the
    gathered sample `[s, dim]` (normalised rows in dataset order)."""
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    seed = config.selection_seed
    pca_dim = config.cluster_settings.pca_dim
    mean, components, reduced = None, None, sample_rows
    if pca_dim is not None and sample_rows.shape[0] >= 2:
        n_components = min(pca_dim, sample_rows.shape[0] - 1, sample_rows.shape[1])
        pca = PCA(n_components=n_components, random_state=seed).fit(sample_rows)
        mean, components = pca.mean_, pca.components_
        reduced = (sample_rows - mean) @ components.T
    n_coarse = min(max(1, coarse_count(n_clusters)[0]), reduced.shape[0])
    centres = KMeans(n_clusters=n_coarse, n_init=1, random_state=seed).fit(reduced).cluster_centers_
    return mean, components, np.asarray(centres, dtype=np.float64)


def _check_config(config: ClusterSelectConfig) -> None:
    """What `select_sharded` implements (`ClusterSelectConfig.sharded_conflicts`)."""
    if not isinstance(config, ClusterSelectConfig):
        raise TypeError(f"`config` must be a ClusterSelectConfig, got {type(config).__name__}.")
    if config.sharded_conflicts():
        raise ValueError(f"select_sharded does not implement {config.sharded_conflicts()}; select on one rank "
                         "(`cluster_features` + `select_subset`, the default pipeline) for these settings.")


def _blocks(n_rows: int):
    return (np.arange(s, min(s + BLOCK_ROWS, n_rows)) for s in range(0, n_rows, BLOCK_ROWS))


def _gather_sample(x: np.ndarray, index: np.ndarray, usable: np.ndarray, n_examples: int,
                   config: ClusterSelectConfig) -> np.ndarray | None:
    """Rank 0: the normalised rows `[s, dim]` at the seeded sample's dataset indices, in dataset order (`None`
    elsewhere); the other ranks send their sampled rows only."""
    sample = seeded_sample(n_examples, config.cluster_settings.cluster_sample_size, config.selection_seed)
    mine = usable if sample is None else usable[np.isin(index[usable], sample)]
    part = (index[mine], _normalised(x, mine))
    if distributed.is_distributed():
        parts = [None] * distributed.world_size() if distributed.rank() == 0 else None
        torch.distributed.gather_object(part, parts, dst=0)
        if distributed.rank() != 0:
            return None
    else:
        parts = [part]
    order_index = np.concatenate([p[0] for p in parts])
    return np.concatenate([p[1] for p in parts])[np.argsort(order_index, kind="stable")]


def _project(x: np.ndarray, rows: np.ndarray, mean, components) -> dict[str, np.ndarray]:
    """Normalised rows `x[rows]` projected to the PCA space (`reduced` `[n, d]`) and their duplicate cells
    (`cells` `[n, 4]` int64: plain and shifted grid, `duplicates.cell_codes`), block by block."""
    dim = x.shape[1] if components is None else components.shape[0]
    reduced, cells = np.empty((rows.size, dim)), np.empty((rows.size, 4), dtype=np.int64)
    for block in _blocks(rows.size):
        unit = _normalised(x, rows[block])
        cells[block] = np.concatenate(cell_codes(unit), axis=1)
        reduced[block] = unit if components is None else (unit - mean) @ components.T
    return {"reduced": reduced, "cells": cells}


def select_sharded(
    local_features: Any,
    local_indices: Sequence[int],
    n_examples: int,
    config: ClusterSelectConfig,
    *,
    loss_tokens: Any = None,
    norms: Any = None,
    losses: Any = None,
    return_clustering: bool = False,
) -> Selection | tuple[Selection, ClusteringResult]:
    """Select `selection_budget(n_examples, config.data_fraction)` examples with every rank holding only its own
    feature rows (see the module docstring for the steps). Call it on every rank of the process group (torchrun /
    accelerate; gloo or NCCL), or in one process with all rows.

    Args:
        local_features (`np.ndarray`, `np.memmap` or `torch.Tensor` of shape `[n_local, dim]`): this rank's feature
            rows (e.g. `FeatureOutput.features` of its shard); read block by block, never copied whole.
        local_indices (sequence of `int`, length `n_local`): the dataset index of each local row; the ranks'
            indices together must be `range(n_examples)`, each once.
        n_examples (`int`): size of the whole pool.
        config (`ClusterSelectConfig`): `data_fraction`, `within_cluster` (+ `quota`, `duplicate_weight`),
            `selection_seed`, and the `fine_kmeans` settings (`kept_per_cluster`, `pca_dim`, `cluster_sample_size`:
            the rows rank 0 receives for the fit).
        loss_tokens (array-like of shape `[n_local]`, *optional*): loss-bearing tokens per local row; rows with 0 are
            deferred (kept only when the budget needs them), as in `select_subset`.
        norms, losses (array-like of shape `[n_local]`, *optional*): raw feature norms / warm-up losses of the local
            rows, for the within-cluster rules that use them (pass both on every rank or on none).
        return_clustering (`bool`, *optional*, defaults to `False`): also return the partition of every example
            (all-gathered: 16 bytes per example on every rank).
    Returns:
        `Selection`, identical on every rank: kept `indices` `[m]` (sorted), `weights` `[m]` summing to
        `n_examples`, global cluster `labels` `[m]`, and `stage_seconds` (wall-clock seconds on this rank of
        `screen`, `pca` (sample gather, PCA and coarse fit), `assign` (projection, duplicate cells, coarse centre),
        `route` (sending rows to their group's owner), `fit` (duplicate merge and fine KMeans), `quotas`,
        `within_cluster`, `gather` (all-gathering the kept indices and weights)). With `return_clustering`,
        `(selection, clustering)`: a `ClusteringResult` whose `labels` / `raw_labels` `[n_examples]` number the
        clusters as `cluster_features` does (NaN/inf rows, then rows without loss-bearing tokens, as the last
        groups), with no `reduced` columns, no `groups`, and `params` (`sharded`, `world_size`, `pca_dim`,
        `n_clusters_requested`, `kept_per_cluster`, `sampled_rows`, `n_nonfinite_features`, `n_no_loss_tokens`).
    Raises:
        TypeError: if `config` is not a `ClusterSelectConfig`.
        ValueError: if the inputs are misshapen, the indices are not distinct and in range or do not add up to
            `n_examples` over the ranks, no row is clusterable, or `config` asks for a setting this path does not
            implement (another `cluster_method`, a token budget, strata, a target, token near-duplicates).
    """
    _check_config(config)
    stages: dict[str, float] = {}
    with timed(stages, "screen"):
        x, index, deferred, norms, losses = _agreed_inputs(local_features, local_indices, n_examples, config,
                                                           loss_tokens, norms, losses)
        finite = np.concatenate([np.isfinite(np.asarray(x[b])).all(axis=1) for b in _blocks(index.size)]) \
            if index.size else np.zeros(0, dtype=bool)
        usable = np.flatnonzero(finite & ~deferred)
        nonfinite = np.flatnonzero(~finite & ~deferred)
        totals = all_sum_array(np.array([index.size, usable.size, nonfinite.size, _index_hash(index)],
                                        dtype=np.int64))
    if int(totals[0]) != n_examples:
        raise ValueError(f"the ranks hold {int(totals[0])} rows in all but `n_examples` is {n_examples}.")
    if int(totals[3]) != _index_hash(np.arange(n_examples)):
        raise ValueError(f"the ranks' `local_indices` do not cover range({n_examples}) exactly once (an index held "
                         "by two ranks, or by none).")
    n_usable, n_nonfinite = int(totals[1]), int(totals[2])
    if n_usable == 0:
        raise ValueError("no example has finite features and loss-bearing tokens: nothing to cluster.")
    settings = config.cluster_settings
    requested = requested_clusters(n_usable, config.data_fraction, settings.kept_per_cluster)
    n_clusters = min(requested, n_usable)
    with timed(stages, "pca"):
        sample_rows = _gather_sample(x, index, usable, n_examples, config)
        fitted = None if sample_rows is None else _fit_projection(sample_rows, config, n_clusters)
        mean, components, centres = distributed.broadcast_object(fitted)
        del sample_rows
    with timed(stages, "assign"):
        projected = _project(x, usable, mean, components)
        projected["group"] = nearest_labels(projected["reduced"], centres, np.arange(centres.shape[0]))
    received = route_rows(index, usable, nonfinite, projected, norms, losses, centres.shape[0], stages)
    selection, owned = select_routed(received, n_examples, n_usable, n_nonfinite, n_clusters, config,
                                     index[deferred], stages, norms is not None, losses is not None)
    if not return_clustering:
        return selection
    n_deferred = n_examples - n_usable - n_nonfinite
    params = {"sharded": True, "world_size": distributed.world_size(),
              "pca_dim": None if components is None else int(components.shape[0]),
              "n_clusters_requested": requested, "kept_per_cluster": settings.kept_per_cluster,
              "sampled_rows": min(n_examples, settings.cluster_sample_size or n_examples),
              "n_nonfinite_features": n_nonfinite, "n_no_loss_tokens": n_deferred}
    return selection, clustering_of(owned, index[deferred], n_examples, params)


