"""`ClusterTrainer`: the Trainer adapter of a `SelectionRun` (layer L4).

Each Trainer hook here is a few lines that turn Trainer state into plain arguments for the run (`run.py`) or turn
the run's samplers into DataLoaders built the way `Trainer._get_dataloader` builds them. One `train()` call runs:
`warmup_steps` optimizer steps on the full data (logical epoch 0) → features → clustering and exact-budget selection
→ epochs over the selected subset with the allocation's batch plan and per-example loss weights. The step plan is
fixed before training, so the LR schedule spans exactly the steps that run.

Private Trainer hooks overridden (supported versions in `compat.py`; `tests/test_compat.py` checks their signatures):
`set_initial_training_values`, `_init_training_state`, `_run_epoch`. Public hooks: `train`,
`get_train_dataloader`, `compute_loss`, `create_model_card`, `log`.

A second `train()` on the same trainer starts a new `SelectionRun`: it plans again and re-selects with the model as
it is then (after a warm-up on the full data, as the first call did); `resume_from_checkpoint` reuses the saved one.
"""

from __future__ import annotations

import dataclasses
import warnings

from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer
from transformers.trainer_utils import seed_worker

from ..config import ClusterSelectConfig, check_target_combination
from ..data import INDEX_KEY, IndexCollator, IndexedDataset, LossTokensCollator, example_lengths, has_replies, token_digest
from ..feature_cache import model_config_dict
from ..persistence import load_selection, resolve_resume_checkpoint
from ..reporting.report import SelectionReport
from ..run import SelectionRun, resolve_run_facts
from ..schedule import StepPlan
from ..validation import (check_feature_context, check_loss_path, check_map_style, check_train_dataset,
                          check_training_inputs)
from ..weighting import weighted_loss
from . import compat
from .callbacks import ClusterSelectCallback
from .feature_model import load_feature_model, load_given_selection
from .outputs import SelectionOutputsMixin
from .model_checks import labels_are_shifted, warn_if_hooks_overridden
from .target import resolve_target

compat.warn_if_unsupported()


class ClusterSelectMixin(SelectionOutputsMixin):
    """Adds cluster-based data selection to a `transformers.Trainer` subclass. Put it first in the bases.

    Args:
        cluster_config (`ClusterSelectConfig`, *optional*): selection settings; defaults to `ClusterSelectConfig()`.
        feature_model (`torch.nn.Module` or `str`, *optional*): the model the features come from instead of the
            trained one — a smaller model that shares the tokenizer (and, for classification, the label set), or
            the path of one (loaded with the trained model's class, `from_pretrained`). It is used as given (not
            warmed up), in eval mode, moved to the training device. `None` = the trained model (after the warm-up);
            the `feature_layers` setting applies to whichever model it is.
        target_dataset (`datasets.Dataset` or list of `dict`, *optional*): a few to a few hundred examples of what
            the model will be evaluated on, in the training data's format (for `ClusterSFTTrainer`, raw rows as
            `train_dataset`, prepared the same way); the selection keeps the examples that teach them
            (`selection/targeted.py`; tasks from the `target_column` setting). `ClusterSelectConfig(target="eval")`
            uses `eval_dataset` instead. `None` = untargeted.
        *args, **kwargs: everything the underlying trainer takes, unchanged.
    Attributes:
        selection_run (`SelectionRun` or `None`): the current `train()` call's plan, selection, weights, samplers.
    Raises:
        TypeError: if `cluster_config` is not a `ClusterSelectConfig`, or `feature_model` is neither a module nor a
            path.
        ValueError: if `feature_model` is a path without a `config.json`, or its vocabulary is smaller than the
            trained model's. From `train()`, before any model work, for a dataset without `__len__`, an empty dataset, a
            dataset or subset smaller than one global batch, `warmup_steps` not below the planned steps, examples
            without the columns the collator needs, no loss-bearing label at all, or an incomplete checkpoint to
            resume from (see `validation.py`, `persistence.resolve_resume_checkpoint`); a target set that
            `integrations.target.resolve_target` refuses.
        ImportError: from `train()`, before any model work, if `cluster_method="hdbscan"` and `hdbscan` is broken.
    """

    def __init__(self, *args: Any, cluster_config: ClusterSelectConfig | None = None,
                 feature_model: torch.nn.Module | str | None = None, selection: Any = None,
                 target_dataset: Any = None, **kwargs: Any) -> None:
        self._cs_given_selection = load_given_selection(selection)
        if cluster_config is None and self._cs_given_selection is not None:  # train with the saved settings
            cluster_config = ClusterSelectConfig.from_dict(self._cs_given_selection.config)
        cluster_config = ClusterSelectConfig() if cluster_config is None else cluster_config
        if not isinstance(cluster_config, ClusterSelectConfig):
            raise TypeError(f"`cluster_config` must be a ClusterSelectConfig, got {type(cluster_config).__name__}.")
        if self._cs_given_selection is not None and cluster_config.selection_warmup_steps != 0:
            cluster_config = dataclasses.replace(cluster_config, selection_warmup_steps=0)  # nothing to warm up for
        self.cluster_config = cluster_config
        self.feature_model = load_feature_model(feature_model, kwargs.get("model", args[0] if args else None))
        check_map_style(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))  # before Trainer's own check
        self.target_dataset = target_dataset
        self._cs_target = None  # the checked TargetSet of the current run (plan())
        self.selection_run: SelectionRun | None = None
        self._cs_subset_sampler = self._cs_subset_loader = None  # the prepared loader of the run's subset sampler
        self._cs_resume_selection: tuple = (None, None)  # (checkpoint folder, its SavedSelection) read by train()
        super().__init__(*args, **kwargs)
        warn_if_hooks_overridden(type(self))
        self.cluster_callback = ClusterSelectCallback(self)
        self.add_callback(self.cluster_callback)
        callbacks = self.callback_handler.callbacks  # first: its end-of-training log reaches the reporters (e.g.
        callbacks.insert(0, callbacks.pop(callbacks.index(self.cluster_callback)))  # TensorBoard) before they close

    # ---- what the run decided, for users and notebooks ----------------------------------------------------------
    @property
    def step_plan(self) -> StepPlan | None:
        """The current run's `StepPlan` (`None` before `plan()` / `train()`)."""
        return None if self.selection_run is None else self.selection_run.plan

    @property
    def selection(self):
        """The current run's `Selection` (`None` before selection)."""
        return None if self.selection_run is None else self.selection_run.selection

    @property
    def selection_report(self) -> SelectionReport | None:
        """The current run's `SelectionReport` (`None` before selection)."""
        return None if self.selection_run is None else self.selection_run.report

    # ---- planning (before any model work) -----------------------------------------------------------------------
    def plan(self) -> StepPlan:
        """Validate the data and settings, start a new `SelectionRun` and return its step plan (no model work).

        Raises:
            ValueError: for the bad inputs listed in the class docstring.
        """
        check_train_dataset(self.train_dataset)  # None, dict of splits, streaming, empty
        if self.target_dataset is not None:  # before the allocation's own checks (CluSTER's needs 2 processes)
            check_target_combination(self.cluster_config)
        args, model = self.args, self.accelerator.unwrap_model(self.model)
        lengths = example_lengths(self.train_dataset)  # untokenized data fails here, naming the columns
        facts = resolve_run_facts(
            self.feature_model if self.feature_model is not None else model, self.cluster_config,
            shift_labels=labels_are_shifted(model), strata=self._cs_strata(),  # a missing column fails now
            token_digest=token_digest(self.train_dataset), model_config=model_config_dict(model),
            n_dropped_by_preparation=self._cs_dropped_by_preparation(), replies=has_replies(self._cs_training_view()[0]))
        name = type(model).__name__
        check_loss_path(loss_weighted=facts.loss_weighted, label_smoothing_factor=args.label_smoothing_factor,
                        has_compute_loss_func=self.compute_loss_func is not None, shift_labels=facts.shift_labels,
                        model_config=getattr(model, "config", None), model_name=name)
        check_feature_context(self.cluster_config, shift_labels=facts.shift_labels, model_name=name)
        self.selection_run = run = SelectionRun(
            self.cluster_config, facts, lengths=lengths, world_size=args.world_size,
            per_device_batch_size=self._train_batch_size, gradient_accumulation_steps=args.gradient_accumulation_steps,
            num_train_epochs=args.num_train_epochs, max_steps=args.max_steps, lr_warmup_steps=args.warmup_steps,
        )
        dataset, collator = self._cs_training_view()  # hdbscan importable, collator works, some label bears a loss
        check_training_inputs(
            dataset, collator, self.cluster_config, label_names=self.label_names,
            needs_labels=not (self.can_return_loss or self.compute_loss_func is not None),
            shift_labels=facts.shift_labels,
        )
        self._cs_target = resolve_target(
            self.cluster_config, self.target_dataset, self.eval_dataset, view=self._cs_feature_view,
            collator=collator, train_columns=getattr(dataset, "column_names", None), shift_labels=facts.shift_labels,
            n_examples=len(dataset), prepare=self._cs_prepare_target if self.target_dataset is not None else None)
        run.target_fingerprint = None if self._cs_target is None else self._cs_target.fingerprint
        return run.plan

    def _cs_feature_view(self, dataset: Any) -> Any:
        """A dataset as the feature pass reads training data (unused columns removed, as `_cs_training_view`)."""
        import datasets

        if isinstance(dataset, datasets.Dataset):
            return self._remove_unused_columns(dataset, description="Target")
        return dataset

    def _cs_prepare_target(self, dataset: Any) -> Any:
        """The data preparation a target set needs before its feature view: none for `Trainer` (it takes the
        training data's format as given); `ClusterSFTTrainer` tokenizes raw rows as TRL does."""
        return dataset

    def _cs_dropped_by_preparation(self) -> int | None:
        """Examples the trainer's data preparation dropped before selection (`RunFacts.n_dropped_by_preparation`);
        `None` here: plain `Trainer` prepares nothing. `ClusterSFTTrainer` returns its count."""
        return None

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs: Any):
        """`Trainer.train` with selection: validates and plans first; an allocation that selects before training
        (CluSTER's) selects here, or reuses the checkpoint's selection.

        Raises:
            ValueError: see the class docstring.
        """
        plan = self.plan()
        # True → the newest *complete* checkpoint (a run killed while saving leaves an incomplete one)
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir,
                                                           plan.warmup_steps)
        run = self.selection_run
        if self._cs_given_selection is not None:  # ClusterTrainer(selection=...): the same checks as a resume
            run.adopt_given(self._cs_given_selection)
        else:
            saved = load_selection(resume_from_checkpoint) if resume_from_checkpoint else None
            self._cs_resume_selection = (resume_from_checkpoint, saved)  # read once; adopted in _init_training_state
            if saved is not None and run.selects_before_training:
                run.adopt_saved(saved)
            elif saved is not None:  # other data, settings or model are named before Trainer loads the weights
                run.check_saved(saved)
            elif run.selects_before_training:
                self.run_selection(self.model)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ---- dataloaders --------------------------------------------------------------------------------------------
    def _cs_training_view(self) -> tuple[Dataset, Any]:
        """The dataset and collator as `Trainer._get_dataloader` prepares them (unused columns removed)."""
        import datasets

        if isinstance(self.train_dataset, datasets.Dataset):
            return self._remove_unused_columns(self.train_dataset, description="Training"), self.data_collator
        return self.train_dataset, self._get_collator_with_removed_columns(self.data_collator, description="Training")

    def _cs_build_loader(self, batch_sampler) -> DataLoader:
        """A DataLoader over `batch_sampler` with the parameters `Trainer._get_dataloader` uses, prepared."""
        dataset, collator = self._cs_training_view()
        args = self.args
        loader = DataLoader(
            IndexedDataset(dataset), batch_sampler=batch_sampler, collate_fn=IndexCollator(collator),
            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            multiprocessing_context=args.dataloader_multiprocessing_context,
            prefetch_factor=args.dataloader_prefetch_factor, in_order=args.dataloader_in_order,
            worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
        )
        return self.accelerator.prepare(loader)

    def _cs_subset_dataloader(self) -> DataLoader:
        """The prepared DataLoader of the run's subset sampler, built once per selection."""
        sampler = self.selection_run.subset_sampler
        if self._cs_subset_sampler is not sampler:
            self._cs_subset_sampler, self._cs_subset_loader = sampler, self._cs_build_loader(sampler)
        return self._cs_subset_loader

    def get_train_dataloader(self) -> DataLoader:
        """The warm-up dataloader: the full data in a seeded random order, balanced over ranks, yielding exactly
        `warmup_steps × gradient_accumulation_steps` per-device batches per rank (a full epoch when warm-up is 0).
        The subset's dataloader is built after selection."""
        if self.selection_run is None:
            self.plan()
        return self._cs_build_loader(self.selection_run.warmup_sampler)

    # ---- the training loop's private hooks ------------------------------------------------------------------------
    def set_initial_training_values(self, args, dataloader):
        """Trainer hook: report the planned epochs and steps instead of ones derived from `len(dataloader)`."""
        plan = self.selection_run.freeze_plan()
        total_batch = self.get_total_train_batch_size(args)
        return (plan.num_epochs, plan.selected_steps_per_epoch, plan.n_examples, plan.total_steps * total_batch,
                total_batch, plan.selected_batches_per_epoch, plan.total_steps)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial):
        """Trainer hook: place a resumed run in the right logical epoch, restore its clock and saved selection."""
        epochs_trained, skip = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        self.cluster_callback = next(c for c in self.callback_handler.callbacks if isinstance(c, ClusterSelectCallback))
        self.cluster_callback.trainer = self  # a callback restored from a checkpoint is a new object
        run = self.selection_run
        if resume_from_checkpoint is not None:
            run.clock.restore(ClusterSelectCallback.saved_seconds(self.state.stateful_callbacks))
        if resume_from_checkpoint is not None and self.state.global_step > 0:
            folder, saved = self._cs_resume_selection
            if folder != resume_from_checkpoint:  # not read by `train()` for this checkpoint
                saved = load_selection(resume_from_checkpoint)
            if saved is not None and run.selection is None:
                run.adopt_saved(saved)  # first: other data or settings are named before any step arithmetic
            epochs_trained, skip = run.plan.locate(self.state.global_step)
            skip = 0 if self.args.ignore_data_skip else skip
        return epochs_trained, skip

    def _run_epoch(self, model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, *args, **kwargs):
        """Trainer hook: logical epoch 0 is the warm-up on the full data; later epochs run on the selected subset
        (selected at the start of the first of them)."""
        run = self.selection_run
        phase = "warmup" if run.is_warmup_epoch(epoch) else "training"
        if phase == "training":
            if run.selection is None:
                self.run_selection(model)
            train_dataloader = self._cs_subset_dataloader()
            if self.state.global_step == run.plan.warmup_steps > 0 and run.resets_optimizer:  # first subset step,
                self._cs_reset_optimizer_state()  # also when resumed there
        if run.pending_metrics is not None:
            pending, run.pending_metrics = run.pending_metrics, None
            self.log(pending)
        # the Trainer's own set_epoch does not reach our sampler under accelerate's BatchSamplerShard once a resumed
        # epoch wraps it in SkipBatchSampler (multi-process resume): set the logical epoch on it directly
        run.sampler_for(epoch)
        steps_in_epoch, num_update_steps_per_epoch = run.plan.epoch_lengths(epoch)
        self.callback_handler.train_dataloader = train_dataloader
        run.clock.start(phase)
        try:
            return super()._run_epoch(
                model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, *args, **kwargs
            )
        finally:
            run.clock.stop(phase)

    def _cs_reset_optimizer_state(self) -> None:
        """Clear the optimizer's per-parameter state (`reset_optimizer_state`: `SelectionRun.resets_optimizer`)."""
        if self.optimizer is None:
            return
        if self.is_deepspeed_enabled:  # its engine owns the state
            warnings.warn("reset_optimizer_state: the optimizer state is not cleared under DeepSpeed.", stacklevel=2)
        else:
            getattr(self.optimizer, "optimizer", self.optimizer).state.clear()  # through accelerate's wrapper

    # ---- selection ------------------------------------------------------------------------------------------------
    def run_selection(self, model: torch.nn.Module | None = None) -> None:
        """Compute features on every rank's shard, cluster and select on rank 0, broadcast, and build the subset's
        dataloader (`SelectionRun.select`). Called by the training loop; exposed for notebooks.

        Args:
            model (`torch.nn.Module`, *optional*): the (possibly wrapped) model; defaults to `self.model`.
        """
        if self.selection_run is None:
            self.plan()
        run = self.selection_run
        dataset, collator = self._cs_training_view()
        if self.cluster_config.feature_settings.feature_context == "loss_tokens":
            config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
            if config is not None and callable(getattr(config, "get_text_config", None)):
                config = config.get_text_config()
            collator = LossTokensCollator(collator, bos_token_id=getattr(config, "bos_token_id", None))
        source = self.accelerator.unwrap_model(model if model is not None else self.model)
        if self.feature_model is not None:
            source = self.feature_model.to(self.args.device)
        run.select(
            source, dataset, collator,
            batch_size=self.cluster_config.feature_settings.feature_batch_size or self.args.per_device_eval_batch_size,
            show_progress=self.is_world_process_zero() and not self.args.disable_tqdm,
            tokenizer=getattr(self, "processing_class", None), target=self._cs_target,
        )

    def _cs_strata(self) -> list | None:
        """The values of `cluster_config.stratify_column` in `train_dataset`, one per example (`None` if unset).

        Raises:
            ValueError: if the dataset has no such column.
        """
        name = self.cluster_config.stratify_column
        if name is None:
            return None
        dataset = self.train_dataset
        columns = getattr(dataset, "column_names", None) or (list(dataset[0]) if len(dataset) else [])
        if name not in columns:
            raise ValueError(f"`stratify_column` {name!r} is not a column of `train_dataset` (columns: "
                             f"{sorted(columns)}).")
        if hasattr(dataset, "column_names"):
            return list(dataset.with_format(None)[name] if hasattr(dataset, "with_format") else dataset[name])
        return [example[name] for example in dataset]

    # ---- weighted loss ------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer hook: multiply each example's loss by its selection weight (mean 1 over the kept set). During
        warm-up, or when every weight is 1, this is exactly the parent's loss. In training it also counts the batch's
        padded tokens for the token-balance metrics."""
        if model.training:
            tokens = inputs.get("input_ids", inputs.get("attention_mask"))
            self.cluster_callback.record_tokens(int(tokens.numel()) if isinstance(tokens, torch.Tensor) else 0)
        index = inputs.pop(INDEX_KEY, None)
        weights = None if self.selection_run is None else self.selection_run.loss_weights(index)
        if weights is None or inputs.get("labels") is None:  # warm-up, all weights 1, or a loss without labels
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        return self._cs_weighted_loss(model, inputs, weights, return_outputs, num_items_in_batch)

    def _cs_weighted_loss(self, model, inputs, weights, return_outputs=False, num_items_in_batch=None):
        """One forward for the logits, then `weighting.weighted_loss` with per-example `weights` `[batch]`, shifted
        as the run decided. `ClusterSFTTrainer` replaces it with TRL's fused loss."""
        shift = self.selection_run.facts.shift_labels
        outputs = model(**{k: v for k, v in inputs.items() if not (shift and k == "labels")})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        scaled = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        loss = weighted_loss(logits, inputs["labels"], weights, causal=shift,
                             num_items_in_batch=num_items_in_batch if scaled else None)
        if self.args.average_tokens_across_devices and scaled:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """`Trainer.log`; every training log (the one with `loss`) also gets the token-balance means of the optimizer
        steps since the previous one: `cluster_select/max_tokens_per_rank`, `cluster_select/mean_tokens_per_rank`
        (padded tokens per step) and `cluster_select/max_over_mean_tokens`."""
        callback = getattr(self, "cluster_callback", None)
        if "loss" in logs and callback is not None:
            logs.update(callback.token_metrics())
        super().log(logs, *args, **kwargs)

    # ---- published artefacts ------------------------------------------------------------------------------------


class ClusterTrainer(ClusterSelectMixin, Trainer):
    """`transformers.Trainer` that trains on a cluster-selected, re-weighted, rank-balanced subset.

    Use it exactly like `Trainer`, plus `cluster_config=ClusterSelectConfig(...)`:

        trainer = ClusterTrainer(model=model, args=args, train_dataset=train, cluster_config=ClusterSelectConfig())
        trainer.train()

    Method: CluSTER (Kim et al., EMNLP 2026) with HDBSCAN clusters, exact budgets and token balance; see README.
    """
