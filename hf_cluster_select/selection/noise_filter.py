"""Label and reply noise: examples whose target disagrees with the targets of examples with similar inputs.

The k-nearest-neighbour agreement of Deep k-NN for noisy labels (Bahri, Jiang & Gupta, ICML 2020, section 3), on the
feature pass's own outputs. Every example `i` has an input state `u_i` (`FeatureOutput.inputs`: the head input at
its first loss-bearing token — the pooled token of a classification head, the last prompt token of a causal LM — so
it has seen no target) and a learning-effect feature `f_i`. Its agreement is the mean cosine `cos(f_i, f_j)` over
its `neighbors` nearest examples `j` by `cos(u_i, u_j)`. For BADGE, `f ≈ (p − onehot(y)) ⊗ h`, so `cos(f_i, f_j)`
is about `[y_i = y_j] · cos(h_i, h_j)`: the share of similar inputs with the same label, weighted by how similar they
are; for a language model's `hidden_mean`, how alike the replies to similar prompts are. A relabelled example or a
reply swapped from another task has low agreement.

`ClusterSelectConfig(strategy_kwargs={"noise_share": s})` defers, in every cluster, its share `s` of lowest agreement
(`with_noise_filter`): they are kept only when the budget cannot be met without them (`select.select_from_labels`'s
`deferred`). The default `"auto"` (`pipeline.resolved_auto_settings`) is, for a classification head,
`AUTO_NOISE_SHARE` (0.2), or, when the pool looks noisy (`estimated_noise_rate`, the share of examples whose feature
points against their neighbours', at least `NOISY_POOL_RATE` = 0.3), that estimate (at most `MAX_AUTO_SHARE`, 0.5);
for a language model 0.2 when its replies look noisy (`reply_disagreement` at least `NOISY_REPLY_SHARE` = 0.1), else
off. Measured in `benchmarks/README.md` ("Noisy and redundant pools", the noise filter) and
`docs/configuration.md` ("Noisy labels and replies").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._types import ClusteringResult
from ..config import ClusterSelectConfig
from ..settings import MAX_AUTO_SHARE, NOISY_POOL_RATE, NOISY_REPLY_SHARE, SelectionSettings

REFERENCE_ROWS = 8192  # neighbours are searched among at most this many rows (a seeded sample above it)
CHUNK_VALUES = 1 << 24  # floats per chunk of rows: similarities [c, reference] plus neighbours' features [c, k, dim]


def _unit_rows(values: Any, name: str, n: int | None = None) -> np.ndarray:
    """`values` as float32 `[n, d]` with L2-normalised rows (zero rows stay zero).

    Raises:
        ValueError: if it is not 2-D, has another row count than `n`, or holds NaN/inf.
    """
    array = np.asarray(values, dtype=np.float32)
    if array.ndim != 2 or (n is not None and array.shape[0] != n):
        raise ValueError(f"`{name}` must have shape [{'n_examples' if n is None else n}, dim], got {array.shape}.")
    if not np.isfinite(array).all():
        raise ValueError(f"`{name}` holds NaN or inf values.")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.maximum(norms, np.finfo(np.float32).tiny)


def neighbour_agreement(inputs: Any, features: Any, *, neighbors: int = SelectionSettings.noise_neighbors,
                        seed: int = ClusterSelectConfig.selection_seed,
                        reference_rows: int = REFERENCE_ROWS) -> np.ndarray:
    """Every example's target agreement with its input neighbours (module docstring; Bahri et al., ICML 2020).

    Args:
        inputs (array-like of shape `[n_examples, r]`): input states `u` (`FeatureOutput.inputs`); a zero row is an
            example without loss-bearing tokens: it is nobody's neighbour and its agreement is `inf` (never flagged;
            such examples are deferred anyway).
        features (array-like of shape `[n_examples, dim]`): learning-effect features `f` (any scale: rows are
            L2-normalised here).
        neighbors (`int`, *optional*, defaults to `SelectionSettings.noise_neighbors`): neighbours `k` per example,
            >= 1 (fewer when fewer other examples have an input state).
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the reference sample when
            there are more than `reference_rows` examples.
        reference_rows (`int`, *optional*, defaults to `REFERENCE_ROWS`): neighbours are searched among all examples
            up to this many, else among a seeded uniform sample of this many (cost: `n · reference_rows · r`
            multiply-adds).
    Returns:
        `np.ndarray` of shape `[n_examples]`, float64: mean cosine of `f_i` with its neighbours' `f_j`, in [-1, 1]
        (`inf` for a zero input row or when no other example has an input state).
    Raises:
        ValueError: for misshapen or non-finite inputs, or `neighbors` / `reference_rows` < 1.
        TypeError: if `neighbors` or `reference_rows` is not an int.
    """
    return neighbour_agreements(inputs, [features], neighbors=neighbors, seed=seed, reference_rows=reference_rows)[0]


def neighbour_agreements(inputs: Any, feature_sets: list[Any], *, neighbors: int = SelectionSettings.noise_neighbors,
                         seed: int = ClusterSelectConfig.selection_seed,
                         reference_rows: int = REFERENCE_ROWS) -> list[np.ndarray]:
    """`neighbour_agreement` of every array of `feature_sets` (each `[n_examples, dim_j]`) over one search of the
    input neighbours: the search (`n · reference_rows · r` multiply-adds) is the cost, shared by the sets. Arguments,
    returns (one array per set) and errors as `neighbour_agreement`."""
    for name, value in (("neighbors", neighbors), ("reference_rows", reference_rows)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"`{name}` must be an int >= 1, got {value!r}.")
        if value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value}.")
    u = _unit_rows(inputs, "inputs")
    sets = [_unit_rows(features, "features", u.shape[0]) for features in feature_sets]
    n = u.shape[0]
    present = np.flatnonzero(np.abs(u).sum(axis=1) > 0)
    reference = present
    if reference.size > reference_rows:
        reference = np.sort(np.random.default_rng(seed).choice(present, size=reference_rows, replace=False))
    agreements = [np.full(n, np.inf) for _ in sets]
    k = min(int(neighbors), reference.size - 1) if reference.size > 1 else 0
    if k < 1:
        return agreements
    u_ref = u[reference]
    slot = np.full(n, -1)
    slot[reference] = np.arange(reference.size)
    chunk = max(1, CHUNK_VALUES // (reference.size + k * max(f.shape[1] for f in sets)))
    for start in range(0, present.size, chunk):
        rows = present[start:start + chunk]
        similarity = u[rows] @ u_ref.T  # [c, m]
        own = slot[rows]
        has_own = own >= 0
        similarity[np.flatnonzero(has_own), own[has_own]] = -np.inf  # an example is not its own neighbour
        nearest = reference[np.argpartition(-similarity, k - 1, axis=1)[:, :k]]  # [c, k] example indices
        for f, agreement in zip(sets, agreements):  # one [c, k, dim] gather at a time
            agreement[rows] = np.einsum("cd,ckd->c", f[rows], f[nearest]) / k
    return agreements


def centred_features(inputs: Any, features: Any) -> np.ndarray:
    """`features` `[n_examples, dim]` as float64 minus their mean over the examples with an input state (a nonzero
    row of `inputs` `[n_examples, r]`); the others' rows stay as they are (they take no part in the agreement).

    Raises:
        ValueError: for misshapen or non-finite inputs (as `neighbour_agreement`).
    """
    u = _unit_rows(inputs, "inputs")
    _unit_rows(features, "features", u.shape[0])  # shape and finiteness
    centred = np.array(features, dtype=np.float64)
    present = np.abs(u).sum(axis=1) > 0
    if present.any():
        centred[present] -= centred[present].mean(axis=0)
    return centred


def suspected_noise(agreement: Any, share: float, clusters: Any = None) -> np.ndarray:
    """The `share · m` examples (rounded half up) of lowest `agreement` in every cluster of `m` examples (in the whole
    pool when `clusters` is None), ties to the lower index, as a bool mask `[n]`.

    Flagging per cluster keeps every cluster's share of what stays: on 20 Newsgroups with 40% relabelled training
    labels it kept the clusters' budget shares (TV distance 0.006–0.009 against 0.07–0.08 flagging over the whole
    pool) and won 5 of 6 paired seed-fraction cells against it (`benchmarks/README.md`, the noise filter).

    Args:
        agreement (array-like of shape `[n_examples]`): `neighbour_agreement`'s output (`inf` is never flagged).
        share (`float`): fraction 0–1 of the examples to flag, in [0, 1).
        clusters (array-like of shape `[n_examples]`, *optional*): cluster labels (any ints; HDBSCAN's noise label
            -1 is one more group); None flags over the whole pool.
    Returns:
        `np.ndarray` of shape `[n_examples]`, bool.
    Raises:
        ValueError: if `share` is outside [0, 1), `agreement` is not 1-D or `clusters` has another shape.
    """
    if isinstance(share, bool) or not isinstance(share, (int, float, np.floating)) or not 0.0 <= share < 1.0:
        raise ValueError(f"`share` must be a fraction in [0, 1), got {share!r}.")
    agreement = np.asarray(agreement, dtype=np.float64)
    if agreement.ndim != 1:
        raise ValueError(f"`agreement` must have shape [n_examples], got {agreement.shape}.")
    mask = np.zeros(agreement.size, dtype=bool)
    if clusters is None:
        groups = [np.arange(agreement.size)]
    else:
        clusters = np.asarray(clusters)
        if clusters.shape != agreement.shape:
            raise ValueError(f"`clusters` must have shape {agreement.shape} like `agreement`, got {clusters.shape}.")
        groups = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    for members in groups:
        values = agreement[members]
        count = min(math.floor(round(float(share) * members.size, 6) + 0.5), int(np.isfinite(values).sum()))
        order = np.lexsort((members, values))  # lowest agreement first, then the lower index
        mask[members[order[:count]]] = True
    return mask


def estimated_noise_rate(agreement: Any) -> float:
    """The pool's estimated label-noise rate: the share 0–1 of the examples (with a finite agreement) whose
    learning-effect feature points, on average, against those of their input neighbours (`agreement` < 0).

    For BADGE, `cos(f_i, f_j)` of two similar inputs is positive when their labels agree and negative when they
    differ (`(p − onehot(y_i)) · (p − onehot(y_j)) < 0` once the model leans to either label), so a relabelled
    example among correctly labelled neighbours falls below 0. Measured after the warm-up (`benchmarks/README.md`,
    the noise filter): 0.11 on clean 20 Newsgroups, 0.25 / 0.38 with 20 / 40 % of its labels replaced, 0.07 with 60 %
    duplicated rows; 0.22 / 0.34 / 0.42 on skill classification (`niclass`) clean / 20 / 40 %. A language model's
    `hidden_mean` features all point one way (agreement 0.8–1.0), so it estimates 0 there: `reply_disagreement` reads
    them centred.

    Args:
        agreement (array-like of shape `[n_examples]`): `neighbour_agreement`'s output (`inf` rows are left out).
    Returns:
        `float`: fraction 0–1 (0.0 when no example has a finite agreement).
    Raises:
        ValueError: if `agreement` is not 1-D.
    """
    agreement = np.asarray(agreement, dtype=np.float64)
    if agreement.ndim != 1:
        raise ValueError(f"`agreement` must have shape [n_examples], got {agreement.shape}.")
    finite = agreement[np.isfinite(agreement)]
    return float((finite < 0).mean()) if finite.size else 0.0


def reply_disagreement(inputs: Any, features: Any, *, neighbors: int = SelectionSettings.noise_neighbors,
                       seed: int = ClusterSelectConfig.selection_seed) -> float:
    """A language model's pool-level noise signal: the share 0–1 of the examples whose reply feature, centred on the
    pool's mean feature, points against those of their prompt neighbours (`estimated_noise_rate` of
    `neighbour_agreement` on `features − mean`).

    The `hidden_mean` features of a language model share one large component (raw agreement 0.8–1.0 on every pool),
    so the sign is read after subtracting the mean over the examples with an input state. It finds about a third of
    the swapped replies (Natural-Instructions SFT after the warm-up: 0.00 clean, 0.06 with 20 % of replies
    swapped, 0.125–0.135 with 40 %, under 0.01 with 60 % duplicated rows) and 0.04–0.07 on clean MathQA, whose
    solutions differ more from one problem to the next (`benchmarks/README.md`, the noise filter);
    `NOISY_REPLY_SHARE` sits between.

    Args:
        inputs (array-like of shape `[n_examples, r]`): input states (`neighbour_agreement`).
        features (array-like of shape `[n_examples, dim]`): learning-effect features.
        neighbors (`int`, *optional*, defaults to `SelectionSettings.noise_neighbors`): neighbours per example.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the reference sample.
    Returns:
        `float`: fraction 0–1 (0.0 when fewer than two examples have an input state).
    Raises:
        ValueError: for misshapen or non-finite inputs (`neighbour_agreement`).
    """
    return estimated_noise_rate(neighbour_agreement(inputs, centred_features(inputs, features), neighbors=neighbors,
                                                    seed=seed))


def with_noise_filter(result: ClusteringResult, inputs: Any, features: Any, settings: SelectionSettings,
                      seed: int, estimate: str | None = None) -> tuple[ClusteringResult, np.ndarray | None]:
    """`(result with params["n_suspected_noise"], suspected [n] bool)` when `inputs` (input states `[n, r]`) are
    given: in every cluster of `result.labels`, its share of lowest `neighbour_agreement` of `features` `[n, dim]`
    (`suspected_noise`); else `(result, None)`. The share is `settings.noise_share`, unless the user left
    `noise_share="auto"` and `estimate` says how the pool's noise is read:
    - `"labels"` (a classification head): `estimated_noise_rate` (at most `MAX_AUTO_SHARE`) replaces it when that is
      at least `NOISY_POOL_RATE`; params get `noise_rate_estimate` and `noise_share_applied` (fractions 0–1);
    - `"replies"` (a language model): the share is kept when `reply_disagreement` is at least `NOISY_REPLY_SHARE`,
      else 0 (off); params get `reply_disagreement` and `noise_share_applied`.

    Raises:
        ValueError: for an `estimate` other than None, "labels" or "replies".
    """
    if estimate not in (None, "labels", "replies"):
        raise ValueError(f"`estimate` must be None, 'labels' or 'replies', got {estimate!r}.")
    if inputs is None:
        return result, None
    feature_sets = [features] + ([centred_features(inputs, features)] if estimate == "replies" else [])
    agreement, *centred = neighbour_agreements(inputs, feature_sets, neighbors=settings.noise_neighbors, seed=seed)
    share, params = float(settings.noise_share), {}
    if estimate == "labels":
        rate = estimated_noise_rate(agreement)
        share = min(rate, MAX_AUTO_SHARE) if rate >= NOISY_POOL_RATE else share
        params = {"noise_rate_estimate": round(rate, 4), "noise_share_applied": round(share, 4)}
    elif estimate == "replies":
        disagreeing = estimated_noise_rate(centred[0])  # `reply_disagreement`, over the same neighbour search
        share = share if disagreeing >= NOISY_REPLY_SHARE else 0.0
        params = {"reply_disagreement": round(disagreeing, 4), "noise_share_applied": round(share, 4)}
    suspected = suspected_noise(agreement, share, result.labels)
    params["n_suspected_noise"] = int(suspected.sum())
    return dataclasses.replace(result, params={**result.params, **params}), suspected
