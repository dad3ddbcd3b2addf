"""ClusterSelectMixin: the selection logic shared by ClusterTrainer and ClusterSFTTrainer (layer L4).

One `train()` call runs: `warmup_steps` optimizer steps on the full data (logical epoch 0) → learning-effect
features (sharded over ranks, gathered) → clustering and exact-budget selection (rank 0, broadcast) → epochs over
the selected subset with a rank- and token-balanced batch plan and per-example loss weights. The step plan is fixed
before training, so the LR schedule spans exactly the steps that run.

Private Trainer hooks overridden (pinned transformers range in setup.cfg; each is tested to still be called):
`set_initial_training_values`, `_init_training_state`, `_run_epoch`. Public hooks: `train`,
`get_train_dataloader`, `compute_loss`, `create_model_card`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .allocation import check_paper_allocation
from .artifacts import SelectionArtifactsMixin
from .callbacks import ClusterSelectCallback
from .config import ClusterSelectConfig
from .data import IndexCollator, IndexedDataset, INDEX_KEY, LossTokensCollator, example_lengths
from .pipeline import select_with_model
from .persistence import data_fingerprint, load_selection, resolve_resume_checkpoint
from .report import SelectionReport
from .sampler import ClusterBatchSampler
from .schedule import StepPlan, plan_steps, resolve_warmup_steps
from .selection import selection_budget
from .validation import check_map_style, check_train_dataset, check_training_inputs
from .weighting import cluster_rank_weights, weighted_loss


class ClusterSelectMixin(SelectionArtifactsMixin):
    """Adds cluster-based data selection to a `transformers.Trainer` subclass. Put it first in the bases.

    Args:
        cluster_config (`ClusterSelectConfig`, *optional*): selection settings; defaults to `ClusterSelectConfig()`.
        *args, **kwargs: everything the underlying trainer takes, unchanged.
    Raises:
        TypeError: if `cluster_config` is not a `ClusterSelectConfig`.
        ValueError: from `train()`, before any model work, for a dataset without `__len__`, an empty dataset, a
            dataset or subset smaller than one global batch, `warmup_steps` not below the planned steps, examples
            without the columns the collator needs, no loss-bearing label at all, or an incomplete checkpoint to
            resume from (see `validation.py`, `persistence.resolve_resume_checkpoint`).
        ImportError: from `train()`, before any model work, if `cluster_method="hdbscan"` and `hdbscan` is broken.
    """

    def __init__(self, *args: Any, cluster_config: ClusterSelectConfig | None = None, **kwargs: Any) -> None:
        if cluster_config is None:
            cluster_config = ClusterSelectConfig()
        if not isinstance(cluster_config, ClusterSelectConfig):
            raise TypeError(f"`cluster_config` must be a ClusterSelectConfig, got {type(cluster_config).__name__}.")
        self.cluster_config = cluster_config
        check_map_style(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))  # before Trainer's own check
        self.step_plan: StepPlan | None = None
        self.selection = None
        self.selection_report: SelectionReport | None = None
        self._cs_lengths: np.ndarray | None = None
        self._cs_labels: np.ndarray | None = None
        self._cs_raw_labels: np.ndarray | None = None
        self._cs_loss_weights: torch.Tensor | None = None
        self._cs_selected_loader: DataLoader | None = None
        self._cs_resume_from: str | None = None
        self._cs_warmup_sampler: ClusterBatchSampler | None = None
        self._cs_selected_sampler: ClusterBatchSampler | None = None
        self._cs_plan_fixed = False  # True once the LR schedule's length is handed to the Trainer
        self._cs_defer_log = False  # selection before the training state exists: log it when the loop starts
        self._cs_pending_log: dict | None = None
        super().__init__(*args, **kwargs)
        self.cluster_callback = ClusterSelectCallback(self)
        self.add_callback(self.cluster_callback)

    # ---- planning (before any model work) -------------------------------------------------------------------
    def _cs_resolve_warmup_steps(self, n: int, n_kept: int) -> int:
        config, args = self.cluster_config, self.args
        if config.allocation == "paper":  # CluSTER selects before training (config.__post_init__ allows only 0)
            return 0
        if config.warmup_steps is not None:
            return config.warmup_steps
        base_total = None
        if 0 < args.warmup_steps < 1 and args.max_steps <= 0:
            base_total = plan_steps(
                n_examples=n, n_kept=n_kept, warmup_steps=0, num_train_epochs=args.num_train_epochs, **self._cs_geometry()
            ).total_steps
        return resolve_warmup_steps(args.warmup_steps, max_steps=args.max_steps, total_without_warmup=base_total)

    def _cs_geometry(self) -> dict[str, int]:
        return dict(
            world_size=self.args.world_size,
            per_device_batch_size=self._train_batch_size,
            gradient_accumulation_steps=self.args.gradient_accumulation_steps,
        )

    def plan(self) -> StepPlan:
        """Validate the data and settings and fix every step count of the run (no model work).

        Returns:
            `StepPlan`; also stored as `self.step_plan`.
        Raises:
            ValueError: for the bad inputs listed in the class docstring.
        """
        n = check_train_dataset(self.train_dataset)  # None, dict of splits, streaming, empty
        n_kept = selection_budget(n, self.cluster_config.data_fraction)
        if self.cluster_config.allocation == "paper":
            check_paper_allocation(self.args.world_size, self.cluster_config.cluster_method,
                                   self.cluster_config.kmeans_n_clusters)
        if self.cluster_config.feature_context == "loss_tokens" and not self._cs_is_causal_lm():
            raise ValueError(
                "`feature_context='loss_tokens'` applies to causal language models (labels aligned with "
                f"`input_ids`); {type(self.model).__name__} is not one. Use `feature_context='full'`."
            )
        self._cs_lengths = example_lengths(self.train_dataset)
        self.step_plan = plan_steps(
            n_examples=n,
            n_kept=n_kept,
            warmup_steps=self._cs_resolve_warmup_steps(n, n_kept),
            num_train_epochs=self.args.num_train_epochs,
            max_steps=self.args.max_steps,
            **self._cs_geometry(),
        )
        dataset, collator = self._cs_training_view()  # hdbscan importable, collator works, some label bears a loss
        check_training_inputs(
            dataset, collator, self.cluster_config, label_names=self.label_names,
            needs_labels=not (self.can_return_loss or self.compute_loss_func is not None),
            shift_labels=not getattr(getattr(self.model, "config", None), "is_encoder_decoder", False),
        )
        return self.step_plan

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs: Any):
        """`Trainer.train` with selection; validates data and settings first and plans the steps.

        Raises:
            ValueError: see the class docstring.
        """
        self.plan()
        # True → the newest *complete* checkpoint (a run killed while saving leaves an incomplete one); resolved here
        # too because the paper allocation reads it before the loop
        resume_from_checkpoint = resolve_resume_checkpoint(
            resume_from_checkpoint, self.args.output_dir, self.step_plan.warmup_steps
        )
        self._cs_resume_from = resume_from_checkpoint
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ---- dataloaders --------------------------------------------------------------------------------------
    def _cs_training_view(self) -> tuple[Dataset, Any]:
        dataset, collator = self.train_dataset, self.data_collator
        try:
            import datasets

            is_hf = isinstance(dataset, datasets.Dataset)
        except ImportError:  # pragma: no cover - datasets is a dependency
            is_hf = False
        if is_hf:
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        return dataset, collator

    def _cs_feature_view(self) -> tuple[Dataset, Any]:
        """Dataset and collator the features are computed from: the training view; with
        `feature_context="loss_tokens"`, each example cut down to its loss-bearing tokens (`LossTokensCollator`)."""
        dataset, collator = self._cs_training_view()
        if self.cluster_config.feature_context == "loss_tokens":
            config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
            if config is not None and callable(getattr(config, "get_text_config", None)):
                config = config.get_text_config()
            collator = LossTokensCollator(collator, bos_token_id=getattr(config, "bos_token_id", None))
        return dataset, collator

    def _cs_is_causal_lm(self) -> bool:
        unwrapped = self.accelerator.unwrap_model(self.model)
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        return base._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()

    def _cs_build_loader(self, batch_sampler: ClusterBatchSampler) -> DataLoader:
        dataset, collator = self._cs_training_view()
        params: dict[str, Any] = {
            "batch_sampler": batch_sampler,
            "collate_fn": IndexCollator(collator),
            "num_workers": self.args.dataloader_num_workers,
            "pin_memory": self.args.dataloader_pin_memory,
            "persistent_workers": self.args.dataloader_persistent_workers,
        }
        if self.args.dataloader_num_workers > 0:
            params["prefetch_factor"] = self.args.dataloader_prefetch_factor
        return self.accelerator.prepare(DataLoader(IndexedDataset(dataset), **params))

    def _cs_make_sampler(self, indices, labels, allocation: str = "balanced", num_batches: int | None = None):
        plan, config = self.step_plan, self.cluster_config
        return ClusterBatchSampler(
            indices=indices,
            labels=labels,
            lengths=self._cs_lengths[np.asarray(indices)],
            world_size=plan.world_size,
            per_device_batch_size=plan.per_device_batch_size,
            seed=config.seed,
            balance_tokens=config.balance_tokens,
            window=config.balance_window,
            allocation=allocation,
            num_batches=num_batches,
        )

    def get_train_dataloader(self) -> DataLoader:
        """The warm-up dataloader: the full data in a seeded random order, balanced over ranks, yielding exactly
        `warmup_steps × gradient_accumulation_steps` per-device batches per rank (a full epoch when warm-up is 0).
        The subset's dataloader is built after selection."""
        plan = self.step_plan or self.plan()
        n = plan.n_examples
        num_batches = plan.warmup_steps * plan.gradient_accumulation_steps * plan.world_size or None
        sampler = self._cs_make_sampler(np.arange(n), np.zeros(n, dtype=np.int64), num_batches=num_batches)
        self._cs_warmup_sampler = sampler
        return self._cs_build_loader(sampler)

    # ---- the training loop's private hooks ------------------------------------------------------------------
    def set_initial_training_values(self, args, dataloader):
        """Trainer hook: report the planned epochs and steps instead of ones derived from `len(dataloader)`.

        With `allocation="paper"` the subset's batch count depends on the cluster sizes, so selection runs here (or
        is read from the checkpoint being resumed), before the Trainer sizes its LR schedule from these values."""
        plan = self.step_plan or self.plan()
        if self.selection is None and self.cluster_config.allocation == "paper":
            self._cs_select_before_training()
            plan = self.step_plan
        self._cs_plan_fixed = True
        total_batch = self.get_total_train_batch_size(args)
        return (
            plan.num_epochs,
            plan.selected_steps_per_epoch,
            plan.n_examples,
            plan.total_steps * total_batch,
            total_batch,
            plan.selected_batches_per_epoch,
            plan.total_steps,
        )

    def _cs_select_before_training(self) -> None:
        saved = load_selection(self._cs_resume_from) if self._cs_resume_from else None
        if saved is not None:
            self._cs_adopt_saved(saved)
            return
        self._cs_defer_log = True  # the Trainer replaces `self.state` next: log once the loop runs
        try:
            self.run_selection(self.model)
        finally:
            self._cs_defer_log = False

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial):
        """Trainer hook: place a resumed run in the right logical epoch and reload its saved selection."""
        epochs_trained, skip = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        for callback in self.callback_handler.callbacks:  # a restored callback is a new object
            if isinstance(callback, ClusterSelectCallback):
                callback.trainer = self
                self.cluster_callback = callback
        self._cs_resume_from = resume_from_checkpoint
        saved_seconds = self.state.stateful_callbacks.get(type(self.cluster_callback).__name__)
        if resume_from_checkpoint is not None and isinstance(saved_seconds, dict):
            self.cluster_callback.restore(saved_seconds.get("attributes", {}).get("seconds", {}))
        if resume_from_checkpoint is not None and self.state.global_step > 0:
            epochs_trained, skip = self.step_plan.locate(self.state.global_step)
            if self.args.ignore_data_skip:
                skip = 0
            saved = load_selection(resume_from_checkpoint)
            if saved is not None:
                self._cs_adopt_saved(saved)
        return epochs_trained, skip

    def _run_epoch(self, model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, *args, **kwargs):
        """Trainer hook: logical epoch 0 is the warm-up on the full data; later epochs run on the selected subset
        (selected at the start of the first of them)."""
        plan = self.step_plan
        phase = "warmup" if plan.is_warmup_epoch(epoch) else "training"
        if phase == "training":
            if self.selection is None:
                self.run_selection(model)
            train_dataloader = self._cs_selected_loader
        if self._cs_pending_log is not None:
            pending, self._cs_pending_log = self._cs_pending_log, None
            self.log(pending)
        # the Trainer's own set_epoch does not reach a sampler under accelerate's BatchSamplerShard once a resumed
        # epoch wraps it in SkipBatchSampler (multi-process resume): set the logical epoch on our sampler directly
        sampler = self._cs_selected_sampler if phase == "training" else self._cs_warmup_sampler
        if sampler is not None:
            sampler.set_epoch(epoch)
        steps_in_epoch, num_update_steps_per_epoch = plan.epoch_lengths(epoch)
        self.callback_handler.train_dataloader = train_dataloader
        self.cluster_callback.start(phase)
        try:
            return super()._run_epoch(
                model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, *args, **kwargs
            )
        finally:
            self.cluster_callback.stop(phase)

    # ---- selection -----------------------------------------------------------------------------------------
    def run_selection(self, model: torch.nn.Module | None = None) -> None:
        """Compute features on every rank's shard, cluster and select on rank 0, broadcast, and build the subset's
        dataloader. Called by the training loop; exposed for notebooks.

        Args:
            model (`torch.nn.Module`, *optional*): the (possibly wrapped) model; defaults to `self.model`.
        """
        plan = self.step_plan or self.plan()
        dataset, collator = self._cs_feature_view()
        outcome = select_with_model(
            self.accelerator.unwrap_model(model if model is not None else self.model),
            dataset,
            collator,
            config=self.cluster_config,
            plan=plan,
            lengths=self._cs_lengths,
            callback=self.cluster_callback,
            batch_size=self.cluster_config.feature_batch_size or self.args.per_device_eval_batch_size,
            show_progress=self.is_world_process_zero() and not self.args.disable_tqdm,
        )
        chosen, labels, raw_labels, report = outcome.selection, outcome.labels, outcome.raw_labels, outcome.report
        self.selection_report = report
        self._cs_set_selection(chosen, labels, raw_labels)
        report.selected_steps = self.step_plan.selected_steps  # re-planned from the paper allocation's real length
        if self._cs_defer_log:
            self._cs_pending_log = report.summary_metrics()
        else:
            self.log(report.summary_metrics())

    def _cs_adopt_saved(self, saved) -> None:
        if saved.fingerprint != data_fingerprint(self._cs_lengths):
            raise ValueError(
                "the selection saved in the checkpoint was made on different training data (fingerprint mismatch); "
                "resume with the same `train_dataset` or start a new run."
            )
        self._cs_set_selection(saved.selection, saved.labels, saved.raw_labels)
        if saved.extra.get("report"):
            self.selection_report = SelectionReport.from_dict(saved.extra["report"])

    def _cs_set_selection(self, selection, labels, raw_labels) -> None:
        plan, config = self.step_plan, self.cluster_config
        if selection.n_kept != plan.n_kept:
            raise RuntimeError(f"selection kept {selection.n_kept} examples but the plan expected {plan.n_kept}.")
        self.selection = selection
        self._cs_labels, self._cs_raw_labels = np.asarray(labels), np.asarray(raw_labels)
        weights = torch.zeros(plan.n_examples, dtype=torch.float32)
        weights[torch.as_tensor(selection.indices)] = torch.as_tensor(self._cs_kept_loss_weights(), dtype=torch.float32)
        self._cs_loss_weights = weights
        sampler = self._cs_make_sampler(selection.indices, selection.labels, allocation=config.allocation)
        if len(sampler) != plan.selected_batches_per_epoch * plan.world_size and config.allocation == "paper" and (
            not self._cs_plan_fixed
        ):  # one cluster per rank: the largest kept cluster sets the batch count; plan the steps from it
            self.step_plan = plan = plan_steps(
                n_examples=plan.n_examples,
                n_kept=plan.n_kept,
                warmup_steps=plan.warmup_steps,
                num_train_epochs=self.args.num_train_epochs,
                max_steps=self.args.max_steps,
                selected_batches_per_epoch=len(sampler) // plan.world_size,
                **self._cs_geometry(),
            )
        if len(sampler) != plan.selected_batches_per_epoch * plan.world_size:
            raise RuntimeError(
                f"the subset's batch plan has {len(sampler)} batches, the step plan expected "
                f"{plan.selected_batches_per_epoch * plan.world_size}."
            )
        self._cs_selected_sampler = sampler
        self._cs_selected_loader = self._cs_build_loader(sampler)

    def _cs_kept_loss_weights(self) -> np.ndarray:
        """Loss weight of each kept example `[n_kept]`: the selection's per-example weights (mean 1), or with
        `allocation="paper"` CluSTER's per-rank weight `K·|C_k|/N` (Kim et al., EMNLP 2026) — rank `k` trains only
        cluster `k`, so every example of a rank's batch carries its cluster's full-data share times `K`."""
        if self.cluster_config.allocation != "paper":
            return self.selection.loss_weights()
        return cluster_rank_weights(self.selection.labels, self._cs_labels, self.step_plan.world_size)

    # ---- weighted loss -------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer hook: multiply each example's loss by its selection weight (rescaled to mean 1 over the kept
        set). During warm-up, or when every weight is 1, this is exactly the parent's loss. In training it also
        counts the batch's padded tokens for the token-balance metrics."""
        if model.training:
            tokens = inputs.get("input_ids", inputs.get("attention_mask"))
            self.cluster_callback.record_tokens(int(tokens.numel()) if isinstance(tokens, torch.Tensor) else 0)
        index = inputs.pop(INDEX_KEY, None)
        weights = None
        if index is not None and self._cs_loss_weights is not None:
            weights = self._cs_loss_weights[index.cpu()]
            if torch.all(weights == 1):
                weights = None
        labels = inputs.get("labels")
        if weights is None or labels is None or self.label_smoother is not None or self.compute_loss_func is not None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        return self._cs_weighted_loss(model, inputs, weights, return_outputs, num_items_in_batch)

    def _cs_weighted_loss(self, model, inputs, weights, return_outputs=False, num_items_in_batch=None):
        """The loss of a batch whose examples carry selection weights `[batch]` (`compute_loss` with weights ≠ 1):
        one forward for the logits, then `weighted_loss`. `ClusterSFTTrainer` replaces it with TRL's fused loss."""
        labels = inputs.get("labels")
        causal = self._cs_is_causal_lm()
        outputs = model(**{k: v for k, v in inputs.items() if not (causal and k == "labels")})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        scaled = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        loss = weighted_loss(logits, labels, weights, causal=causal, num_items_in_batch=num_items_in_batch if scaled else None)
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
