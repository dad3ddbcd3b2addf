"""Selection from a model, across ranks: features → gather → cluster + select on rank 0 → broadcast (layer L3).

No Trainer import: `SelectionRun.select` hands in the model, the data view and the step plan; this module returns the
selection and its measured report. Timings go to the `PhaseClock` passed in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import distributed
from ._types import ClusteringResult, Selection
from .clock import PhaseClock
from .config import ClusterSelectConfig
from .features import FEATURES, describe_feature, effective_layers, feature_used, resolve_feature
from .feature_cache import FeatureCache
from .features.proxy import truncated_layers
from .reporting.feature_map import feature_map_points
from .reporting.report import SelectionReport
from .schedule import StepPlan
from .selection import cluster_features, select_subset
from .validation import check_loss_tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionOutcome:
    """What `select_with_model` returns, identical on every rank.

    Attributes:
        selection (`Selection`): kept indices `[n_kept]`, weights, kept labels.
        labels (`np.ndarray` of shape `[n_examples]`): cluster of every example.
        raw_labels (`np.ndarray` of shape `[n_examples]`): clusterer label of every example (-1 = noise).
        report (`SelectionReport`): counts and measured seconds (warm-up, features, clustering).
    """

    selection: Selection
    labels: np.ndarray
    raw_labels: np.ndarray
    report: SelectionReport


def select_with_model(
    model: torch.nn.Module,
    dataset: Any,
    collator: Any,
    *,
    config: ClusterSelectConfig,
    plan: StepPlan,
    lengths: Sequence[int],
    clock: PhaseClock,
    batch_size: int,
    shift_labels: bool | None = None,
    merge_unclusterable: bool = False,
    strata: Sequence[Any] | None = None,
    show_progress: bool = True,
    identity: dict | None = None,
    cache: FeatureCache | None = None,
) -> SelectionOutcome:
    """Choose the training subset with the current model (CluSTER, Kim et al., EMNLP 2026, with HDBSCAN clusters).

    Each rank computes the learning-effect features of its strided shard (`distributed.shard_indices`); the rows are
    gathered in dataset order; rank 0 clusters, selects and builds the report; the result is broadcast.

    Args:
        model (`torch.nn.Module`): the unwrapped model (eval mode is set and restored by the feature code).
        dataset (map-style dataset of `dict`): the training examples as the collator expects them.
        collator (`Callable[[list[dict]], dict]`): builds batches with `labels` (-100 = no loss).
        config (`ClusterSelectConfig`): selection settings.
        plan (`StepPlan`): the run's step plan (for counts and geometry in the report).
        lengths (sequence of `int`, length `n_examples`): token length of every example (batching by length).
        clock (`PhaseClock`): measures the `features` and `clustering` phases (and holds the `warmup` seconds).
        batch_size (`int`): examples per feature forward pass.
        shift_labels (`bool`, *optional*): whether labels are shifted (causal LM); `None` = the feature's default.
        merge_unclusterable (`bool`, *optional*, defaults to `False`): see `cluster_features`.
        strata (sequence of length `n_examples`, *optional*): the `stratify_column` values (see `select_subset`).
        show_progress (`bool`, *optional*, defaults to `True`): tqdm bar on this rank.
        identity (`dict`, *optional*): `feature_cache.feature_identity` of these features; with `cache`, a hit
            loads them (on rank 0) instead of the feature pass, and a miss stores them.
        cache (`FeatureCache`, *optional*): where features are looked up and stored; `None` = no cache.
    Returns:
        `SelectionOutcome`. At `data_fraction=1.0` (nothing to drop) and an allocation that does not need exact
        clusters, no feature pass and no clustering run: every example is kept in one cluster with weight 1, so
        training is the stock Trainer's given the same batch order (`keep_everything`).
    Raises:
        ValueError: if no example has a loss-bearing token.
    """
    if config.data_fraction >= 1.0 and not merge_unclusterable:
        return keep_everything(config, plan, lengths, clock)
    clock.start("features")
    features, loss_tokens, norms, losses, from_cache = cached_or_computed_features(
        model, dataset, collator, config=config, n=plan.n_examples, lengths=lengths, batch_size=batch_size,
        shift_labels=shift_labels, show_progress=show_progress, cache=cache, identity=identity)
    check_loss_tokens(loss_tokens)
    clock.stop("features")
    clock.start("clustering")
    payload = None
    if distributed.rank() == 0:
        result = cluster_features(np.asarray(features), config, world_size=plan.world_size, loss_tokens=loss_tokens,
                                  merge_unclusterable=merge_unclusterable)
        chosen = select_subset(result, config, norms=norms, losses=losses, strata=strata, lengths=lengths)
        report = SelectionReport.from_results(
            result,
            chosen,
            config,
            tokens_total=int(loss_tokens.sum()),
            tokens_kept=int(loss_tokens[chosen.indices].sum()),
            token_kind="loss",
            input_tokens_total=int(np.asarray(lengths, dtype=np.int64).sum()),
            input_tokens_kept=int(np.asarray(lengths, dtype=np.int64)[chosen.indices].sum()),
            world_size=plan.world_size,
            per_device_train_batch_size=plan.per_device_batch_size,
            gradient_accumulation_steps=plan.gradient_accumulation_steps,
            warmup_steps=plan.warmup_steps,
            selected_steps=plan.selected_steps,
            full_data_steps=plan.full_data_steps,
        )
        report.features_from_cache = from_cache
        report.feature_used = describe_feature(*feature_used(model, config.feature, config.feature_layers))
        report.feature_map = feature_map_points(features, config.selection_seed)
        payload = SelectionOutcome(chosen, result.labels, result.raw_labels, report)
    outcome = distributed.broadcast_object(payload)
    clock.stop("clustering")
    return _timed(outcome, clock)


def cached_or_computed_features(model, dataset, collator, *, config: ClusterSelectConfig, n: int,
                                lengths: Sequence[int], batch_size: int, shift_labels: bool | None,
                                show_progress: bool, cache: FeatureCache | None, identity: dict | None) -> tuple:
    """`(features [n, dim] on rank 0 (None elsewhere on a cache hit), loss_tokens [n], norms, losses, from_cache)`:
    from the cache when rank 0 finds `identity` there, else from the feature pass on every rank's shard (stored in
    the cache by rank 0; a failed store is logged, never raised). Used by `select_with_model` and by the
    `hf-cluster-select select` command (one process)."""
    use_cache = cache is not None and identity is not None
    cached = cache.load(identity) if use_cache and distributed.rank() == 0 else None
    if distributed.broadcast_object(cached is not None):  # every rank takes the same branch
        small = distributed.broadcast_object({k: cached.get(k) for k in ("loss_tokens", "norms", "losses")}
                                             if cached is not None else None)
        return (cached["features"] if cached is not None else None, np.asarray(small["loss_tokens"]),
                small["norms"], small["losses"], True)
    local = distributed.shard_indices(n, distributed.world_size(), distributed.rank())
    feature, feature_layers = resolve_feature(model, config.feature, config.feature_layers)
    with truncated_layers(model, feature_layers):
        output = FEATURES.get(feature)(
            model,
            dataset,
            local,
            collator,
            batch_size=batch_size,
            lengths=[int(lengths[i]) for i in local],
            projection_dim=config.projection_dim,
            projection_seed=config.selection_seed,
            show_progress=show_progress,
            shift_labels=shift_labels,
        )
    features = distributed.gather_rows(output.features, local, n)
    loss_tokens = distributed.gather_rows(output.loss_tokens.reshape(-1, 1), local, n).reshape(-1).numpy()
    norms, losses = (None if v is None else distributed.gather_rows(v.reshape(-1, 1), local, n).reshape(-1).numpy()
                     for v in (output.norms, output.losses))  # a custom signal may leave them out
    if effective_layers(model, feature_layers) is not None:
        losses = None  # a truncated pass's losses are not the model's (features/choice.py)
    if use_cache and distributed.rank() == 0 and bool((loss_tokens > 0).any()):
        try:
            cache.save(identity, {"features": features.numpy(), "loss_tokens": loss_tokens, "norms": norms,
                                  "losses": losses})
        except OSError as error:  # a full or read-only disk costs the cache, never the run
            logger.warning("could not store the features in the cache %s: %s", cache.directory, error)
    return features.numpy(), loss_tokens, norms, losses, False


def keep_everything(config: ClusterSelectConfig, plan: StepPlan, lengths: Sequence[int],
                    clock: PhaseClock) -> SelectionOutcome:
    """The selection of `data_fraction=1.0` without model work: all `n_examples` kept, one cluster, weights 1.

    The report counts input tokens (`token_kind="input"`, from `lengths`): no feature pass ran to count the
    loss-bearing ones. Its features and clustering seconds are the (near-zero) measured time of this function.
    """
    n = plan.n_examples
    clock.start("features")
    clock.stop("features")
    clock.start("clustering")
    zeros = np.zeros(n, dtype=np.int64)
    result = ClusteringResult(labels=zeros, raw_labels=zeros, reduced=np.zeros((n, 0), dtype=np.float32),
                              n_clusters=1, method="none", fallback="data_fraction=1.0: nothing to select")
    chosen = Selection(indices=np.arange(n, dtype=np.int64), weights=np.ones(n), labels=zeros, n_total=n)
    tokens = int(np.asarray(lengths, dtype=np.int64).sum())
    report = SelectionReport.from_results(
        result, chosen, config, tokens_total=tokens, tokens_kept=tokens, token_kind="input",
        input_tokens_total=tokens, input_tokens_kept=tokens,
        world_size=plan.world_size, per_device_train_batch_size=plan.per_device_batch_size,
        gradient_accumulation_steps=plan.gradient_accumulation_steps, warmup_steps=plan.warmup_steps,
        selected_steps=plan.selected_steps, full_data_steps=plan.full_data_steps,
    )
    clock.stop("clustering")
    return _timed(SelectionOutcome(chosen, zeros, zeros.copy(), report), clock)


def _timed(outcome: SelectionOutcome, clock: PhaseClock) -> SelectionOutcome:
    """Copy the clock's warm-up, features and clustering seconds into the outcome's report."""
    report = outcome.report
    report.warmup_seconds = clock.measured("warmup")
    report.features_seconds = clock.measured("features")
    report.clustering_seconds = clock.measured("clustering")
    report.selection_seconds = report.features_seconds + report.clustering_seconds
    return outcome
