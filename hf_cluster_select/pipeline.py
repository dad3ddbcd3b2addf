"""Selection from a model, across ranks: features → gather → cluster + select on rank 0 → broadcast (layer L3).

No Trainer import: `SelectionRun.select` and the `select` command hand in the model, the data view and the run's
facts (`RunFacts`); `select_with_model` returns the same `SelectionOutcome` on every rank, from which the caller
builds the report once (`SelectionReport.build`). Timings go to the `PhaseClock` passed in.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import distributed
from ._types import NO_LOSS_LABEL, ClusteringResult, RunFacts, Selection, TargetSet
from .clock import PhaseClock
from .config import ClusterSelectConfig
from .data import has_replies, has_token_column, reply_rows, token_rows
from .feature_cache import FeatureCache
from .features import FEATURES
from .features.head_tokens import token_level_head
from .features.proxy import truncated_layers
from .reporting.feature_map import feature_map_points
from .selection import (WITHIN_CLUSTER_RULES, cluster_features, relevance_scores, select_subset, select_targeted,
                        target_self_relevance)
from .selection.near_duplicates import near_duplicate_groups, union_groups
from .selection.noise_filter import with_noise_filter
from .selection.sharded import select_sharded
from .settings import AUTO, resolve_duplicates, resolve_noise_share
from .validation import check_loss_tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionOutcome:
    """What `select_with_model` returns, identical on every rank.

    Attributes:
        selection (`Selection`): kept indices `[n_kept]`, weights, kept labels.
        clustering (`ClusteringResult`): labels and raw labels `[n_examples]` (-1 = noise), method, fallback and
            parameters; its `reduced` rows are not carried (shape `[n_examples, 0]`).
        loss_tokens (`np.ndarray` of shape `[n_examples]` or `None`): loss-bearing tokens counted by the feature
            pass; `None` when no feature pass ran (`keep_everything`).
        losses (`np.ndarray` of shape `[n_examples]` or `None`): per-example losses of the feature pass (nats), when
            the signal gives them and the pass ran every block (what the loss-based within-cluster rules take).
        features_from_cache (`bool` or `None`): whether the features came from the feature cache; `None` = none.
        feature_map (`dict` or `None`): `feature_map_points` of the features (2-D PCA of a sample).
        target (`dict` or `None`): with a target set, what targeted selection did (`select_targeted`'s summary plus
            the target's `source`, `task_names`, `n_target_per_task` and whether its features came from the cache).
        difficulty (`np.ndarray` of shape `[n_kept]`, float64, or `None`): the feature pass's loss (nats) of each kept
            example, aligned with `selection.indices`: the curriculum order's difficulty (`batching/curriculum.py`),
            also after a truncated pass (its head after the first blocks: a logit-lens proxy); `None` when the signal
            gives no losses or no feature pass ran.
    """

    selection: Selection
    clustering: ClusteringResult
    loss_tokens: np.ndarray | None = None
    losses: np.ndarray | None = None
    features_from_cache: bool | None = None
    feature_map: dict | None = None
    target: dict | None = None
    difficulty: np.ndarray | None = None


def select_with_model(
    model: torch.nn.Module, dataset: Any, collator: Any, *, config: ClusterSelectConfig, facts: RunFacts,
    lengths: Sequence[int], clock: PhaseClock, batch_size: int, merge_unclusterable: bool = False,
    show_progress: bool = True, identity: dict | None = None, cache: FeatureCache | None = None,
    target: TargetSet | None = None, target_identity: dict | None = None,
) -> SelectionOutcome:
    """Choose the training subset with the current model (CluSTER, Kim et al., EMNLP 2026, with fine strata).

    Each rank computes the learning-effect features of its strided shard (`distributed.shard_indices`); the rows are
    gathered in dataset order on rank 0 only (the other ranks hold their shard's rows, never the whole matrix);
    rank 0 clusters and selects; the result (indices, weights, labels) is broadcast. With the `fine_kmeans` setting
    `sharded=True`, nothing is gathered: `selection.sharded.select_sharded` selects with every rank holding its
    shard (no feature cache then).

    With `near_duplicate_threshold` set, rank 0 also groups the examples whose `input_ids` are near copies
    (`near_duplicates.near_duplicate_groups`, its own `near_duplicates` phase) and joins those groups with the
    feature-space ones (`ClusteringResult.groups`) before selecting (targeted selection too: a group is one
    candidate there); `clustering.params["n_near_duplicate_rows"]` counts the examples the token check put into an
    earlier example's group.

    Args:
        model (`torch.nn.Module`): the unwrapped model (eval mode is set and restored by the feature code).
        dataset (map-style dataset of `dict`): the training examples as the collator expects them.
        collator (`Callable[[list[dict]], dict]`): builds batches with `labels` (-100 = no loss).
        config (`ClusterSelectConfig`): selection settings.
        facts (`RunFacts`): the run's resolved facts (feature and blocks, label shift, strata).
        lengths (sequence of `int`, length `n_examples`): token length of every example (batching by length).
        clock (`PhaseClock`): measures the `features`, `near_duplicates` (with `near_duplicate_threshold`) and
            `clustering` phases.
        batch_size (`int`): examples per feature forward pass.
        merge_unclusterable (`bool`, *optional*, defaults to `False`): see `cluster_features`.
        show_progress (`bool`, *optional*, defaults to `True`): tqdm bar on this rank.
        identity (`dict`, *optional*): `feature_cache.feature_identity` of these features; with `cache`, a hit
            loads them (on rank 0) instead of the feature pass, and a miss stores them.
        cache (`FeatureCache`, *optional*): where features are looked up and stored; `None` = no cache.
        target (`TargetSet`, *optional*): a target set: its features come from the same model, signal and
            settings in the same `features` phase, and the budget goes to its tasks (`selection.select_targeted`)
            instead of to the pool's clusters.
        target_identity (`dict`, *optional*): the feature-cache identity of the target's features.
    Returns:
        `SelectionOutcome`. At `data_fraction=1.0` (nothing to drop) and an allocation that does not need exact
        clusters, no feature pass and no clustering run (`keep_everything`).
    Raises:
        ValueError: if no example has a loss-bearing token, or a target task has none.
    """
    if config.data_fraction >= 1.0 and not merge_unclusterable:
        return keep_everything(len(lengths), clock)
    estimate_noise = None  # "auto": the pool's noise is read from the feature pass (`with_noise_filter`)
    if config.selection_settings.noise_share == AUTO:
        estimate_noise = "replies" if token_level_head(model) else "labels"
    resolved = facts.duplicates  # "auto" as the run resolved it once (`run.resolve_run_facts`), else resolved here
    if resolved is None:
        resolved = resolved_auto_settings(config, model, facts.feature, replies=has_replies(dataset))
    config = _with_settings(config, resolved)
    if getattr(config.cluster_settings, "sharded", False):
        return _select_sharded_with_model(model, dataset, collator, config=config, facts=facts, lengths=lengths,
                                          clock=clock, batch_size=batch_size, show_progress=show_progress)
    clock.start("features")
    features, loss_tokens, norms, losses, inputs, from_cache = cached_or_computed_features(
        model, dataset, collator, config=config, facts=facts, lengths=lengths, batch_size=batch_size,
        show_progress=show_progress, cache=cache, identity=identity,
        input_states=config.selection_settings.noise_share > 0 and target is None)
    check_loss_tokens(loss_tokens)
    target_features = None
    if target is not None:
        target_features, target_tokens, _, _, _, target_from_cache = cached_or_computed_features(
            model, target.dataset, collator, config=config, facts=facts, lengths=target.lengths,
            batch_size=batch_size, show_progress=False, cache=cache, identity=target_identity)
    clock.stop("features")
    token_groups = _token_groups(dataset, config, clock)
    clock.start("clustering")
    rule_losses = None if facts.feature_layers is not None else losses  # a truncated pass's are not the model's
    if rule_losses is None and getattr(WITHIN_CLUSTER_RULES.get(config.within_cluster), "uses_losses", False):
        logger.warning("within_cluster=%r needs per-example losses, which this feature pass does not give (a "
                       "truncated language-model pass keeps none): it falls back without them and its loss settings "
                       "(loss_outlier_z, drop_hardest) do nothing (drop_loss_outliers → facility_location, "
                       "drop_hard_random → random, loss_stratified → distance_stratified, importance_loss → "
                       "uniform). feature_layers = the model's depth gives them.", config.within_cluster)
    payload = None
    if distributed.rank() == 0:
        result = cluster_features(np.asarray(features), config, world_size=distributed.world_size(),
                                  loss_tokens=loss_tokens, merge_unclusterable=merge_unclusterable)
        result = with_resolved_settings(result, config, targeted=target is not None)
        if token_groups is not None:
            result = with_near_duplicates(result, token_groups)
        target_summary = None
        if target is None:
            result, suspected = with_noise_filter(result, inputs, features, config.selection_settings,
                                                  config.selection_seed, estimate=estimate_noise)
            chosen = select_subset(result, config, norms=norms, losses=rule_losses, strata=facts.strata,
                                   lengths=lengths, suspected=suspected)
        else:
            chosen, target_summary = _select_for_target(result, features, target, target_features, target_tokens,
                                                        config)
            target_summary["features_from_cache"] = target_from_cache
        summary = dataclasses.replace(result, reduced=np.zeros((result.labels.size, 0), dtype=np.float32))
        difficulty = None if losses is None else np.asarray(losses, dtype=np.float64)[chosen.indices]
        payload = (chosen, summary, feature_map_points(features, config.selection_seed), target_summary, difficulty)
    chosen, summary, feature_map, target_summary, difficulty = distributed.broadcast_object(payload)
    clock.stop("clustering")
    return SelectionOutcome(chosen, summary, np.asarray(loss_tokens),
                            None if rule_losses is None else np.asarray(rule_losses), from_cache, feature_map,
                            target_summary, difficulty)


def with_auto_resolved(config: ClusterSelectConfig, model: torch.nn.Module, feature: str, *,
                       replies: bool = False) -> ClusterSelectConfig:
    """`config` with the settings `resolved_auto_settings` resolves set to what `"auto"` means for `model`, its
    resolved `feature` and whether the examples give their replies; values the user gave are kept."""
    return _with_settings(config, resolved_auto_settings(config, model, feature, replies=replies))


def _with_settings(config: ClusterSelectConfig, settings: dict) -> ClusterSelectConfig:
    """`config` with `settings` (strategy settings by name) over its `strategy_kwargs`."""
    return dataclasses.replace(config, strategy_kwargs={**(config.strategy_kwargs or {}), **settings})


def resolved_auto_settings(config: ClusterSelectConfig, model: torch.nn.Module, feature: str, *,
                           replies: bool = False) -> dict:
    """`{"near_duplicate_threshold", "duplicate_weight", "noise_share"}` of `config` for `model` and its resolved
    `feature` (`RunFacts.feature`), `"auto"` resolved: the token check at 0.7 with `duplicate_weight="one"` for a
    classification head and for a language model whose examples give their replies (`replies`: `data.has_replies`),
    off for other language-model data, a model without an output head (a user feature) and sharded selection
    (`settings.resolve_duplicates`); the noise filter at `AUTO_NOISE_SHARE` unless the selection is sharded,
    `target="eval"` or the feature gives no input states (a user feature) (`settings.resolve_noise_share`; the
    feature pass then reads the pool's noise, `with_noise_filter`: for a classification head an estimate of 0.3 or
    more replaces the share, for a language model the filter stays on only when 0.1 or more of the replies disagree
    with their prompt neighbours'; with a trainer's `target_dataset` it resolves as without one, and the targeted
    path does not run it).

    Raises:
        ValueError: for `noise_share` > 0 given explicitly with a feature that gives no input states.
    """
    token_level = token_level_head(model)
    sharded = bool(getattr(config.cluster_settings, "sharded", False))
    threshold, weight = resolve_duplicates(config.selection_settings, token_level=token_level, token_check=not sharded,
                                           replies=replies)
    with_states = feature in FEATURES.names() and getattr(FEATURES.get(feature), "input_states", False)
    share = resolve_noise_share(config.selection_settings, available=with_states and not sharded
                                and config.target is None)
    if share > 0 and not with_states:
        raise ValueError(f"`noise_share`={share} needs each example's input state, which feature={feature!r} does "
                         "not give (a user feature); use a built-in feature, or noise_share=0.")
    return {"near_duplicate_threshold": threshold, "duplicate_weight": weight, "noise_share": share}


def with_resolved_settings(result: ClusteringResult, config: ClusterSelectConfig,
                           targeted: bool = False) -> ClusteringResult:
    """`result` with `params["near_duplicate_threshold"]`, `params["duplicate_weight"]` and (unless `targeted`: the
    filter does not run with a target set) `params["noise_share"]`: what `"auto"` resolved to (`with_auto_resolved`),
    for the report, the model card and a resumed run's comparison (`saved_selection.config_differences`)."""
    settings = config.selection_settings
    noise = {} if targeted else {"noise_share": settings.noise_share}
    return dataclasses.replace(result, params={**result.params, **noise,
                                               "near_duplicate_threshold": settings.near_duplicate_threshold,
                                               "duplicate_weight": settings.duplicate_weight})


def _token_groups(dataset: Any, config: ClusterSelectConfig, clock: PhaseClock) -> np.ndarray | None:
    """Near-duplicate group of every example by its `input_ids` and, where the dataset says which tokens carry the
    loss (`data.reply_rows`), its reply `[n]` on rank 0 (`None` on other ranks, when `near_duplicate_threshold` is
    unset, or when the examples have no `input_ids`), timed as the `near_duplicates` phase."""
    threshold = config.selection_settings.near_duplicate_threshold
    if threshold is None or not has_token_column(dataset):
        return None
    clock.start("near_duplicates")
    groups = None
    if distributed.rank() == 0:
        groups = near_duplicate_groups(token_rows(dataset), threshold, reply_rows=reply_rows(dataset),
                                       seed=config.selection_seed)[0]
    clock.stop("near_duplicates")
    return groups


def with_near_duplicates(result: ClusteringResult, token_groups: Any) -> ClusteringResult:
    """`result` with its duplicate groups joined with `token_groups` `[n]` (`union_groups`: an example in a
    feature-space group and a token group joins both) and `params["n_near_duplicate_rows"]`: the examples the
    token check put into an earlier example's group (n − number of token groups); warns above half of them."""
    token_groups = np.asarray(token_groups).reshape(-1)
    groups = result.groups if result.groups is not None else np.arange(token_groups.size)
    params = {**result.params, "n_near_duplicate_rows": int(token_groups.size - np.unique(token_groups).size)}
    if params["n_near_duplicate_rows"] > token_groups.size / 2:
        logger.warning("the near-duplicate check merged %d of %d examples; if they are not copies (one task's rows "
                       "under a long instruction, one-word replies), set near_duplicate_threshold=None",
                       params["n_near_duplicate_rows"], token_groups.size)
    return dataclasses.replace(result, groups=union_groups(groups, token_groups)[0], params=params)


def _select_for_target(result: ClusteringResult, features: Any, target: TargetSet, target_features: Any,
                       target_tokens: np.ndarray, config: ClusterSelectConfig) -> tuple[Selection, dict]:
    """Targeted selection on rank 0: relevance of every pool example to every target task (target examples without
    a loss-bearing token left out), then `select_targeted`; the summary names the target.

    Raises:
        ValueError: if a target task has no example with a loss-bearing token.
    """
    usable = np.asarray(target_tokens).reshape(-1) > 0
    empty = [name for task, name in enumerate(target.task_names) if not usable[target.tasks == task].any()]
    if empty:
        raise ValueError(f"target task(s) {empty} have no loss-bearing token (every label -100): the target set "
                         "must show what the model should produce.")
    scores = relevance_scores(np.asarray(features), np.asarray(target_features)[usable], target.tasks[usable])
    thresholds = target_self_relevance(np.asarray(target_features)[usable], target.tasks[usable])
    chosen, summary = select_targeted(result.labels, scores, data_fraction=config.data_fraction,
                                      settings=config.target_settings, seed=config.selection_seed,
                                      deferred=np.asarray(result.raw_labels) == NO_LOSS_LABEL, groups=result.groups,
                                      thresholds=thresholds)
    summary.update(source=target.source, task_names=list(target.task_names),
                   n_target_per_task=np.bincount(target.tasks, minlength=target.n_tasks).tolist(),
                   target_rule=config.target_settings.target_rule,
                   self_relevance=[None if not np.isfinite(t) else round(float(t), 4) for t in thresholds],
                   target_coverage=config.target_settings.target_coverage)
    return chosen, summary


def cached_or_computed_features(model, dataset, collator, *, config: ClusterSelectConfig, facts: RunFacts,
                                lengths: Sequence[int], batch_size: int, show_progress: bool,
                                cache: FeatureCache | None, identity: dict | None, input_states: bool = False) -> tuple:
    """`(features [n, dim] on rank 0 (None elsewhere), loss_tokens [n], norms, losses, inputs, from_cache)`:
    from the cache when rank 0 finds `identity` there, else from the feature pass (`facts.feature` after
    `facts.feature_layers` blocks) on every rank's shard, stored in the cache by rank 0 (a failed store is logged,
    never raised). `losses` are the pass's own, also after a truncated pass (the head after the first blocks; the
    caller keeps them from the loss-based rules); an entry stored without them by an older version is a miss when
    `order="easy_to_hard"` needs them. `inputs` `[n, r]` (rank 0) are the noise filter's input states when
    `input_states` (an entry stored without them is then a miss, computed again with them), else None."""
    n = len(lengths)
    use_cache = cache is not None and identity is not None
    cached = cache.load(identity) if use_cache and distributed.rank() == 0 else None
    if (cached is not None and cached.get("losses") is None and facts.feature_layers is not None
            and config.order == "easy_to_hard"):
        cached = None  # computed again, with the truncated pass's losses, and stored over the old entry
    if cached is not None and input_states and cached.get("inputs") is None:
        cached = None  # computed again, with the input states, and stored over the old entry
    if distributed.broadcast_object(cached is not None):  # every rank takes the same branch
        small = distributed.broadcast_object({k: cached.get(k) for k in ("loss_tokens", "norms", "losses")}
                                             if cached is not None else None)
        return (cached["features"] if cached is not None else None, np.asarray(small["loss_tokens"]),
                small["norms"], small["losses"], cached.get("inputs") if input_states and cached is not None else None,
                True)
    features, loss_tokens, norms, losses, inputs = gathered_feature_pass(
        model, dataset, collator, config=config, facts=facts, lengths=lengths, batch_size=batch_size,
        show_progress=show_progress, input_states=input_states)
    if use_cache and distributed.rank() == 0 and bool((loss_tokens > 0).any()):
        try:
            cache.save(identity, {"features": features, "loss_tokens": loss_tokens, "norms": norms,
                                  "losses": losses, "inputs": inputs})
        except OSError as error:  # a full or read-only disk costs the cache, never the run
            logger.warning("could not store the features in the cache %s: %s", cache.directory, error)
    return features, loss_tokens, norms, losses, inputs, False


def gathered_feature_pass(model, dataset, collator, *, config: ClusterSelectConfig, facts: RunFacts,
                          lengths: Sequence[int], batch_size: int, show_progress: bool,
                          input_states: bool = False) -> tuple:
    """`(features [n, dim], loss_tokens [n], norms [n], losses [n], inputs [n, r])` as numpy arrays from every rank's
    feature pass (`_feature_pass`): features and input states on rank 0 only (None elsewhere; `inputs` is None
    unless `input_states`), the per-example values on every rank; `norms` / `losses` None where a custom signal
    leaves them out."""
    n = len(lengths)
    local, output = _feature_pass(model, dataset, collator, config=config, facts=facts, lengths=lengths,
                                  batch_size=batch_size, show_progress=show_progress, input_states=input_states)
    features, inputs = (None if v is None else distributed.gather_rows(v, local, n, dst=0)
                        for v in (output.features, output.inputs))  # only rank 0 clusters: None elsewhere
    loss_tokens = distributed.gather_rows(output.loss_tokens.reshape(-1, 1), local, n).reshape(-1).numpy()
    norms, losses = (None if v is None else distributed.gather_rows(v.reshape(-1, 1), local, n).reshape(-1).numpy()
                     for v in (output.norms, output.losses))  # a custom signal may leave them out
    return (None if features is None else features.numpy(), loss_tokens, norms, losses,
            None if inputs is None else inputs.numpy())


def _feature_pass(model, dataset, collator, *, config: ClusterSelectConfig, facts: RunFacts, lengths: Sequence[int],
                  batch_size: int, show_progress: bool, input_states: bool = False) -> tuple[list[int], Any]:
    """This rank's strided shard of the dataset (`distributed.shard_indices`) and its `FeatureOutput`
    (`facts.feature` after `facts.feature_layers` blocks)."""
    local = distributed.shard_indices(len(lengths), distributed.world_size(), distributed.rank())
    with truncated_layers(model, facts.feature_layers):
        output = FEATURES.get(facts.feature)(
            model, dataset, local, collator, batch_size=batch_size, lengths=[int(lengths[i]) for i in local],
            projection_dim=config.feature_settings.projection_dim, projection_seed=config.selection_seed,
            show_progress=show_progress, shift_labels=facts.shift_labels, autocast=facts.feature_autocast,
            **({"input_states": True} if input_states else {}),
        )
    return local, output


def _select_sharded_with_model(model, dataset, collator, *, config: ClusterSelectConfig, facts: RunFacts,
                               lengths: Sequence[int], clock: PhaseClock, batch_size: int,
                               show_progress: bool) -> SelectionOutcome:
    """`select_with_model` with `sharded=True` (`selection/sharded.py`): every rank keeps its own shard's features
    (no gather, no feature cache) and `select_sharded` selects with rows routed between ranks; only the per-example
    loss-token counts and losses are all-gathered (16 bytes per example). The feature map is drawn from rank 0's
    shard."""
    n = len(lengths)
    clock.start("features")
    local, output = _feature_pass(model, dataset, collator, config=config, facts=facts, lengths=lengths,
                                  batch_size=batch_size, show_progress=show_progress)
    loss_tokens = distributed.gather_rows(output.loss_tokens.reshape(-1, 1), local, n).reshape(-1).numpy()
    losses = None if output.losses is None else \
        distributed.gather_rows(output.losses.reshape(-1, 1), local, n).reshape(-1).numpy()
    clock.stop("features")
    check_loss_tokens(loss_tokens)
    clock.start("clustering")
    truncated = facts.feature_layers is not None  # a truncated pass's losses are not the model's: not for the rules
    chosen, result = select_sharded(output.features, local, n, config, loss_tokens=output.loss_tokens,
                                    norms=output.norms, losses=None if truncated else output.losses,
                                    return_clustering=True)
    result = with_resolved_settings(result, config)
    feature_map = None
    if distributed.rank() == 0:
        feature_map = feature_map_points(output.features, config.selection_seed)
        if feature_map is not None:  # shard positions → dataset indices
            feature_map["indices"] = np.asarray(local)[np.asarray(feature_map["indices"], dtype=np.int64)].tolist()
    feature_map = distributed.broadcast_object(feature_map)
    clock.stop("clustering")
    return SelectionOutcome(chosen, result, loss_tokens, None if truncated else losses, False, feature_map, None,
                            None if losses is None else np.asarray(losses, dtype=np.float64)[chosen.indices])


def keep_everything(n: int, clock: PhaseClock) -> SelectionOutcome:
    """The selection of `data_fraction=1.0` without model work: all `n` examples kept, one cluster, weights 1; its
    features and clustering seconds are the (near-zero) measured time of this function."""
    clock.start("features")
    clock.stop("features")
    clock.start("clustering")
    zeros = np.zeros(n, dtype=np.int64)
    result = ClusteringResult(labels=zeros, raw_labels=zeros, reduced=np.zeros((n, 0), dtype=np.float32),
                              n_clusters=1, method="none", fallback="data_fraction=1.0: nothing to select")
    chosen = Selection(indices=np.arange(n, dtype=np.int64), weights=np.ones(n), labels=zeros, n_total=n)
    clock.stop("clustering")
    return SelectionOutcome(chosen, result)
