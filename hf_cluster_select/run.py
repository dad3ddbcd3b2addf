"""The selection run: every decision of one ClusterTrainer `train()` call, without the Trainer (layer L3).

`SelectionRun` takes plain values (dataset size and token lengths, batch geometry, LR warm-up, max steps, epochs,
whether labels are shifted) and owns what follows from them: the step plan, the allocation strategy, the selection
and its per-example loss weights, the warm-up and subset samplers, the measured clock and the resume identity. It
never calls back into a trainer; `integrations.trainer.ClusterSelectMixin` turns Trainer state into its arguments
and its samplers into DataLoaders. It is tested in milliseconds without a Trainer (`tests/test_run.py`).

    ClusterTrainer ──► SelectionRun ──► StepPlan (schedule.py)
                                   ──► Allocation (batching/allocations.py) ──► ClusterBatchSampler ──► batch plan
                                   ──► select_with_model (pipeline.py): features → clustering → selection
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np
import torch

from . import distributed
from ._types import RunFacts, Selection, TargetSet
from .batching.allocations import get_allocation
from .batching.curriculum import check_difficulty, resolve_difficulty
from .batching.padding import plan_padded_tokens, random_batch_padded_tokens
from .batching.plan import micro_steps_capacity
from .batching.sampler import ClusterBatchSampler
from .clock import PhaseClock
from .config import ClusterSelectConfig
from .feature_cache import FeatureCache, feature_identity
from .features.choice import describe_feature, feature_autocast, feature_used, forward_in_bf16
from .persistence import data_fingerprint, save_selection
from .saved_selection import SavedSelection, check_saved_against
from .pipeline import resolved_auto_settings, select_with_model
from .reporting.report import SelectionReport
from .schedule import StepPlan, plan_steps, resolve_warmup_steps, warn_if_subset_unseen
from .selection.budget import selection_budget
from .settings import resolve_balance_tokens, resolve_reset_optimizer_state

logger = logging.getLogger(__name__)


def resolve_run_facts(model: torch.nn.Module, config: ClusterSelectConfig, *, shift_labels: bool,
                      strata: Sequence[Any] | None = None, token_digest: str | None = None,
                      model_config: dict | None = None, n_dropped_by_preparation: int | None = None,
                      replies: bool = False) -> RunFacts:
    """The facts of a run, resolved once: the feature for `model` (`features/choice.py`: `feature="auto"` per model,
    blocks really run, precision) and whether losses are weighted, with the facts the caller measured.

    Args:
        model (`torch.nn.Module`): the model the features come from (the feature model when there is one).
        config (`ClusterSelectConfig`): the selection settings.
        shift_labels (`bool`), strata, token_digest, model_config, n_dropped_by_preparation: see `RunFacts`.
        replies (`bool`, *optional*, defaults to `False`): whether the training examples give their replies
            (`data.has_replies`), which turns the language-model near-duplicate check on (`resolved_auto_settings`).
    Returns:
        `RunFacts`.
    Raises:
        TypeError: if `feature="auto"` and the model has no output head.
    """
    feature, layers = feature_used(model, config.feature, config.feature_settings.feature_layers)
    autocast = feature_autocast(config.feature_settings.feature_precision)
    weighted = config.data_fraction < 1.0 or get_allocation(config.allocation).weights_full_data
    return RunFacts(shift_labels=bool(shift_labels), feature=feature, feature_layers=layers, feature_autocast=autocast,
                    feature_used=describe_feature(feature, layers, forward_in_bf16(model, autocast)),
                    loss_weighted=bool(weighted), strata=None if strata is None else tuple(strata),
                    token_digest=token_digest, model_config=model_config, n_dropped_by_preparation=n_dropped_by_preparation,
                    duplicates=resolved_auto_settings(config, model, feature, replies=replies))


class SelectionRun:
    """The plan, selection, weights and samplers of one training run.

    Args:
        config (`ClusterSelectConfig`): the selection settings.
        facts (`RunFacts`): what the run resolved once (`resolve_run_facts`): feature, label shift, strata, data
            digest, model config; features, validation, the weighted loss and the resume checks all read it.
        lengths (array-like of shape `[n_examples]`, int): tokens of every training example (>= 1).
        world_size (`int`): data-parallel ranks.
        per_device_batch_size (`int`): examples per per-device batch.
        gradient_accumulation_steps (`int`): micro-batches per optimizer step.
        num_train_epochs (`float`): epochs over the selected subset (used when `max_steps <= 0`).
        max_steps (`int`, *optional*, defaults to `-1`): total optimizer steps, warm-up included.
        lr_warmup_steps (`float`, *optional*, defaults to `0`): `TrainingArguments.warmup_steps` (a step count, or a
            ratio below 1); the warm-up on the full data when `config.selection_warmup_steps` is `None`.
        clock (`PhaseClock`, *optional*): the run's clock (a fresh one by default).
    Raises:
        ValueError: for a plan that cannot run (see `schedule.plan_steps`) or an allocation that cannot run on this
            geometry (`Allocation.check`), before any model work.
    """

    def __init__(
        self,
        config: ClusterSelectConfig,
        facts: RunFacts,
        *,
        lengths: Sequence[int],
        world_size: int,
        per_device_batch_size: int,
        gradient_accumulation_steps: int,
        num_train_epochs: float,
        max_steps: int = -1,
        lr_warmup_steps: float = 0,
        clock: PhaseClock | None = None,
    ) -> None:
        if not isinstance(config, ClusterSelectConfig):
            raise TypeError(f"`config` must be a ClusterSelectConfig, got {type(config).__name__}.")
        if not isinstance(facts, RunFacts):
            raise TypeError(f"`facts` must be a RunFacts (resolve_run_facts), got {type(facts).__name__}.")
        self.config, self.facts = config, facts
        self.lengths = np.maximum(np.asarray(lengths, dtype=np.int64).reshape(-1), 1)
        if facts.strata is not None and len(facts.strata) != self.lengths.size:
            raise ValueError(f"`strata` must hold one value per example ({self.lengths.size}), got "
                             f"{len(facts.strata)}.")
        self.clock = clock if clock is not None else PhaseClock()
        self.allocation = get_allocation(config.allocation)
        self.allocation.check(world_size, config)
        self._steps_args = dict(
            world_size=world_size, per_device_batch_size=per_device_batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps, num_train_epochs=num_train_epochs,
            max_steps=max_steps,
        )
        n = int(self.lengths.size)
        n_kept = selection_budget(n, config.data_fraction)
        self.plan: StepPlan = self._plan(n_kept, self._warmup_steps(n, n_kept, lr_warmup_steps))
        warn_if_subset_unseen(self.plan, config.budget_unit)
        self.fingerprint = data_fingerprint(self.lengths, facts.token_digest)
        self.target_fingerprint: str | None = None  # the target set's (`TargetSet.fingerprint`), set by the trainer
        self.selection: Selection | None = None
        self.labels: np.ndarray | None = None  # cluster of every example
        self.raw_labels: np.ndarray | None = None  # clusterer label of every example (-1 = noise)
        self.difficulty: np.ndarray | None = None  # feature-pass loss of every kept example (batching/curriculum.py)
        self.batch_order = self.batch_order_fallback = None  # the order the subset trains in; why it fell back
        self.report: SelectionReport | None = None
        self.pending_metrics: dict | None = None  # selection metrics to log once the training loop runs
        self.subset_sampler: ClusterBatchSampler | None = None
        self.plan_frozen = False  # True once the Trainer has sized its LR schedule from `plan`
        self._dense_weights: torch.Tensor | None = None
        self.warmup_sampler = self._sampler(
            np.arange(n), np.zeros(n, dtype=np.int64), allocation="balanced",
            num_batches=self.plan.warmup_steps * self.plan.gradient_accumulation_steps * self.plan.world_size or None,
        )

    # ---- planning ---------------------------------------------------------------------------------------------
    def _plan(self, n_kept: int, warmup_steps: int, selected_batches_per_epoch: int | None = None) -> StepPlan:
        return plan_steps(n_examples=int(self.lengths.size), n_kept=n_kept, warmup_steps=warmup_steps,
                          selected_batches_per_epoch=selected_batches_per_epoch, **self._steps_args)

    def _warmup_steps(self, n: int, n_kept: int, lr_warmup_steps: float) -> int:
        """Warm-up steps on the full data: 0 for an allocation that selects first or at `data_fraction=1.0`,
        `config.selection_warmup_steps`, or the LR warm-up (a ratio of the planned total, see `schedule.resolve_warmup_steps`)."""
        if self.allocation.selects_before_training or self.config.data_fraction >= 1.0:
            return 0  # selection first; or nothing to select (all examples kept), so nothing to warm up for
        if self.config.selection_warmup_steps is not None:
            return self.config.selection_warmup_steps
        max_steps = self._steps_args["max_steps"]
        total = self._plan(n_kept, 0).total_steps if 0 < lr_warmup_steps < 1 and max_steps <= 0 else None
        return resolve_warmup_steps(lr_warmup_steps, max_steps=max_steps, total_without_warmup=total)

    def freeze_plan(self) -> StepPlan:
        """Mark the plan as handed to the Trainer (its LR schedule spans `plan.total_steps`); returns the plan."""
        self.plan_frozen = True
        return self.plan

    @property
    def selects_before_training(self) -> bool:
        """Whether the selection must exist before the LR schedule is sized (the allocation's batch count depends on
        the clusters: CluSTER's one cluster per rank)."""
        return self.allocation.selects_before_training

    @property
    def resets_optimizer(self) -> bool:
        """Whether the optimizer's state is cleared when the subset starts: `reset_optimizer_state`, `"auto"` resolved
        by the selection's noise estimate (`settings.resolve_reset_optimizer_state`)."""
        return resolve_reset_optimizer_state(self.config.allocation_settings.reset_optimizer_state,
                                             None if self.report is None else self.report.clustering_params)

    def is_warmup_epoch(self, epoch: int) -> bool:
        """Whether logical epoch `epoch` is the warm-up on the full data."""
        return self.plan.is_warmup_epoch(epoch)

    def sampler_for(self, epoch: int) -> ClusterBatchSampler:
        """The sampler of logical epoch `epoch`, set to that epoch (the subset's needs a selection first).

        Raises:
            RuntimeError: for a post-warm-up epoch before any selection.
        """
        if self.is_warmup_epoch(epoch):
            sampler = self.warmup_sampler
        elif self.subset_sampler is None:
            raise RuntimeError("no selection yet: call `select` (or `adopt`) before the first subset epoch.")
        else:
            sampler = self.subset_sampler
        sampler.set_epoch(epoch)
        return sampler

    def _sampler(self, indices, labels, *, allocation: str, num_batches: int | None = None,
                 batches_per_rank: int | None = None, difficulty: np.ndarray | None = None) -> ClusterBatchSampler:
        plan, config = self.plan, self.config
        return ClusterBatchSampler(
            indices=indices, labels=labels, lengths=self.lengths[np.asarray(indices)], world_size=plan.world_size,
            per_device_batch_size=plan.per_device_batch_size, seed=config.selection_seed,
            balance_tokens=resolve_balance_tokens(config.allocation_settings.balance_tokens, plan.world_size,
                                                  config.budget_unit),
            window=config.allocation_settings.balance_window, allocation=allocation, num_batches=num_batches,
            batches_per_rank=batches_per_rank, difficulty=difficulty,
        )

    # ---- selection --------------------------------------------------------------------------------------------
    def select(self, model: torch.nn.Module, dataset: Any, collator: Any, *, batch_size: int,
               show_progress: bool = True, tokenizer: Any = None, target: TargetSet | None = None) -> SelectionReport:
        """Features on every rank's shard, clustering and selection on rank 0, broadcast; then `adopt` it.

        Args:
            model (`torch.nn.Module`): the unwrapped model the features come from.
            dataset (map-style dataset of `dict`), collator (`Callable`): the feature view of the training data.
            batch_size (`int`): examples per feature forward pass.
            show_progress (`bool`, *optional*, defaults to `True`): tqdm bar on this rank.
            tokenizer (*optional*): the trainer's tokenizer, part of the feature-cache identity.
            target (`TargetSet`, *optional*): a target set to aim the selection at (`selection.targeted`); its
                features are cached under their own identity (its tokens instead of the training data's).
        Returns:
            `SelectionReport`, also `self.report`; its summary is left in `pending_metrics` for the trainer to log.
        Raises:
            ValueError: see `pipeline.select_with_model`.
        """
        identity = cache = target_identity = None
        if self.config.feature_cache and self.config.data_fraction < 1.0:
            identity = feature_identity(model, self.config, self.facts, data_fingerprint=self.fingerprint,
                                        collator=collator, tokenizer=tokenizer, probe=dataset)
            cache = FeatureCache()
            if target is not None:
                target_identity = feature_identity(model, self.config, self.facts, data_fingerprint=target.fingerprint,
                                                   collator=collator, tokenizer=tokenizer, probe=target.dataset)
        outcome = select_with_model(
            model, dataset, collator, config=self.config, facts=self.facts, lengths=self.lengths, clock=self.clock,
            batch_size=batch_size, merge_unclusterable=self.allocation.exact_clusters, show_progress=show_progress,
            identity=identity, cache=cache, target=target, target_identity=target_identity,
        )
        self.adopt(outcome.selection, outcome.clustering.labels, outcome.clustering.raw_labels,
                   difficulty=outcome.difficulty)  # may re-plan
        report = SelectionReport.build(
            outcome.clustering, outcome.selection, self.config, lengths=self.lengths, loss_tokens=outcome.loss_tokens,
            plan=self.plan, clock=self.clock, features_from_cache=outcome.features_from_cache,
            feature_used=self.facts.feature_used if outcome.loss_tokens is not None else None,
            feature_map=outcome.feature_map, n_dropped_by_preparation=self.facts.n_dropped_by_preparation,
            target=outcome.target, batch_order=self.batch_order, batch_order_fallback=self.batch_order_fallback)
        self._take_report(report)
        return report

    def adopt_given(self, saved: SavedSelection) -> None:
        """Train on a selection another run made (`ClusterTrainer(selection=...)`): the checks of a resume, except
        that it may have had a warm-up and may come from another model; its report `for_reuse` (nothing paid here
        for warm-up, features or clustering).

        Raises:
            ValueError: see `check_saved`.
        """
        self.adopt_saved(saved, ignore=("selection_warmup_steps",), check_model=False)
        if self.report is not None:
            self._take_report(self.report.for_reuse(self.plan))

    def _take_report(self, report: SelectionReport) -> None:
        self.report, self.pending_metrics = report, report.summary_metrics()

    def adopt(self, selection: Selection, labels: Any, raw_labels: Any, report: SelectionReport | None = None,
              difficulty: Any = None) -> None:
        """Take `selection` as this run's: per-example loss weights, the subset sampler and (for an allocation that
        selects before training, while the plan is not frozen) the step plan re-sized to its batch count.

        `difficulty` (`[n_kept]`, the kept examples' feature-pass loss, nats) is kept and saved; `order="easy_to_hard"`
        plans by it, or without it trains shuffled (logged on rank 0; the report's `batch_order_fallback`).

        With `budget_unit="tokens"` the kept count may differ from `plan.n_kept`: the subset sampler then fills the
        planned `selected_batches_per_epoch` with token-balanced batches (`plan.plan_epoch(micro_steps=...)`).

        Raises:
            ValueError: if it kept another number of examples than the plan's budget (`budget_unit="examples"`) or
                more than the planned steps can hold (`"tokens"`: 4·B per batch), its batch count does not match
                a frozen plan, or `difficulty` is not `[n_kept]` floats.
        """
        plan, by_tokens = self.plan, self.config.budget_unit == "tokens"
        if selection.n_total != plan.n_examples or (selection.n_kept != plan.n_kept and not by_tokens):
            raise ValueError(
                f"the selection kept {selection.n_kept} of {selection.n_total} examples, but this run keeps "
                f"{plan.n_kept} of {plan.n_examples} (data_fraction={self.config.data_fraction})."
            )
        capacity = micro_steps_capacity(plan.selected_batches_per_epoch, plan.world_size, plan.per_device_batch_size)
        if by_tokens and selection.n_kept > capacity:
            raise ValueError(
                f"budget_unit='tokens' kept {selection.n_kept} examples, more than the {capacity} that the planned "
                f"{plan.selected_steps_per_epoch} steps per epoch can hold at 4 × per_device_train_batch_size per batch "
                "(the kept examples are much shorter than average): use budget_unit='examples', or raise "
                "per_device_train_batch_size or data_fraction.")
        self.selection, self.difficulty = selection, check_difficulty(difficulty, (selection.n_kept,))
        ordered_by, self.batch_order, self.batch_order_fallback = resolve_difficulty(self.config.order, self.difficulty)
        if self.batch_order_fallback and distributed.rank() == 0:
            logger.warning("%s.", self.batch_order_fallback)
        self.report = report if report is not None else self.report
        if self.report is not None:
            self.report.batch_order, self.report.batch_order_fallback = self.batch_order, self.batch_order_fallback
        self.labels, self.raw_labels = np.asarray(labels, dtype=np.int64), np.asarray(raw_labels, dtype=np.int64)
        batches = plan.selected_batches_per_epoch if by_tokens else self.allocation.batches_per_rank(
            selection.labels, plan.world_size, plan.per_device_batch_size)
        if batches != plan.selected_batches_per_epoch:
            if self.plan_frozen:
                raise ValueError(f"the subset's batch plan has {batches} batches per rank, the frozen step plan "
                                 f"expected {plan.selected_batches_per_epoch}.")
            self.plan = self._plan(plan.n_kept, plan.warmup_steps, selected_batches_per_epoch=batches)
        dense = torch.zeros(plan.n_examples, dtype=torch.float32)
        kept = self.allocation.loss_weights(selection, self.labels, plan.world_size)
        dense[torch.as_tensor(selection.indices)] = torch.as_tensor(kept, dtype=torch.float32)
        self._dense_weights = dense
        self.subset_sampler = self._sampler(selection.indices, selection.labels, allocation=self.config.allocation,
                                            batches_per_rank=batches if by_tokens else None, difficulty=ordered_by)

    def adopt_saved(self, saved: SavedSelection, ignore: tuple[str, ...] = (), check_model: bool = True) -> None:
        """`check_saved`, then `adopt` the selection and its report."""
        self.check_saved(saved, ignore, check_model)
        report = SelectionReport.from_dict(saved.extra["report"]) if saved.extra.get("report") else None
        self.adopt(saved.selection, saved.labels, saved.raw_labels, report, saved.difficulty)

    def check_saved(self, saved: SavedSelection, ignore: tuple[str, ...] = (), check_model: bool = True) -> None:
        """Refuse a selection made for another run (`saved_selection.check_saved_against` with this run's data,
        target set, config and model); the fields in `ignore` may differ (`ClusterTrainer(selection=...)` ignores
        `selection_warmup_steps`: it trains without a warm-up, and passes `check_model=False`: a selection made with
        one model may train another, so the near-duplicate settings are compared as written, not as resolved).

        Raises:
            ValueError: as `check_saved_against` says (the file, field or setting is named).
        """
        check_saved_against(saved, n_examples=self.plan.n_examples, fingerprint=self.fingerprint,
                            config=self.config, target_fingerprint=self.target_fingerprint,
                            model_config=self.facts.model_config, ignore=ignore, check_model=check_model,
                            duplicates=self.facts.duplicates if check_model else None)

    @property
    def dense_loss_weights(self) -> torch.Tensor | None:
        """Loss weight of every training example `[n_examples]` (float32; 0 for examples not kept), `None` before
        selection: the allocation's weights of the kept examples (`Allocation.loss_weights`), built once in `adopt`."""
        return self._dense_weights

    def loss_weights(self, index: torch.Tensor | None) -> torch.Tensor | None:
        """Loss weight of each example of a batch `[batch]` (mean about 1 over the kept set), looked up by dataset
        index; `None` before selection, without indices, or when every weight of the batch is 1 (then the stock loss
        is exactly right)."""
        if index is None or self._dense_weights is None:
            return None
        weights = self._dense_weights[index.cpu()]
        return None if bool(torch.all(weights == 1)) else weights

    # ---- persistence and report -------------------------------------------------------------------------------
    def save(self, folder: str) -> str | None:
        """Write the selection (indices, weights, labels, the kept examples' difficulty, config, fingerprints of the
        data and the target set, report) into `folder` atomically;
        nothing before selection. Returns the path written, or `None`."""
        if self.selection is None:
            return None
        os.makedirs(folder, exist_ok=True)
        return save_selection(
            folder, self.selection, labels=self.labels, raw_labels=self.raw_labels, config=self.config.to_dict(),
            fingerprint=self.fingerprint, extra={"report": self.report.to_dict() if self.report else None,
                                                 "model_config": self.facts.model_config,
                                                 "target_fingerprint": self.target_fingerprint},
            difficulty=self.difficulty,
        )

    def finalize_report(self, measured_full_seconds: float | None = None) -> SelectionReport | None:
        """Fill the report's warm-up and training seconds from the clock and the savings against full-data training
        (measured when `measured_full_seconds` is given, else estimated: see `SelectionReport.apply_savings`)."""
        if self.report is None:
            return None
        padded = {}
        if self.subset_sampler is not None:  # the cost of a step: padded tokens, stock full-data vs this subset
            sampler = self.subset_sampler
            padded = dict(padded_tokens_per_batch_full=random_batch_padded_tokens(
                self.lengths, self.plan.per_device_batch_size, seed=self.config.selection_seed),
                padded_tokens_per_batch_selected=plan_padded_tokens(sampler.lengths, sampler.plan(1)))
        return self.report.finalize(self.clock, measured_full_seconds=measured_full_seconds, **padded)
