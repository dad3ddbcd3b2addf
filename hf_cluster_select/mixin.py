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

import math
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from . import distributed
from .allocation import check_paper_allocation
from .callbacks import PLOT_FILENAME, ClusterSelectCallback
from .clustering import cluster_features
from .config import ClusterSelectConfig
from .data import IndexCollator, IndexedDataset, INDEX_KEY, LossTokensCollator, example_lengths
from .features.last_layer_grad import last_layer_grad_features
from .features.projection import RandomProjection
from .model_card import write_model_card
from .persistence import data_fingerprint, load_selection, resolve_resume_checkpoint, save_selection
from .plots import plot_cluster_sizes
from .report import SelectionReport
from .sampler import ClusterBatchSampler
from .schedule import StepPlan, plan_steps
from .selection import select_subset, selection_budget
from .validation import check_loss_tokens, check_map_style, check_train_dataset, check_training_inputs
from .weighting import cluster_rank_weights, weighted_loss


class ClusterSelectMixin:
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
    def _cs_check_dataset(self, dataset: Any) -> int:
        return check_train_dataset(dataset)  # None, dict of splits, streaming, empty: validation.py

    def _cs_resolve_warmup_steps(self, n: int, n_kept: int) -> int:
        config, args = self.cluster_config, self.args
        if config.allocation == "paper":  # CluSTER selects before training (config.__post_init__ allows only 0)
            return 0
        if config.warmup_steps is not None:
            return config.warmup_steps
        lr_warmup = args.warmup_steps
        if lr_warmup >= 1 or lr_warmup <= 0:
            return int(max(lr_warmup, 0))
        geometry = self._cs_geometry()
        if args.max_steps > 0:
            return math.ceil(lr_warmup * args.max_steps)
        base = plan_steps(n_examples=n, n_kept=n_kept, warmup_steps=0, num_train_epochs=args.num_train_epochs, **geometry)
        warmup = 0
        for _ in range(100):  # the LR warm-up is a ratio of a total that includes the warm-up itself
            new = math.ceil(lr_warmup * (warmup + base.total_steps))
            if new == warmup:
                break
            warmup = new
        return warmup

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
        n = self._cs_check_dataset(self.train_dataset)
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

    def get_train_dataloader(self) -> DataLoader:
        """The warm-up dataloader: the full data in a seeded random order, balanced over ranks, yielding exactly
        `warmup_steps × gradient_accumulation_steps` per-device batches per rank (a full epoch when warm-up is 0).
        The subset's dataloader is built after selection."""
        plan = self.step_plan or self.plan()
        n = plan.n_examples
        num_batches = plan.warmup_steps * plan.gradient_accumulation_steps * plan.world_size or None
        sampler = ClusterBatchSampler(
            indices=np.arange(n),
            labels=np.zeros(n, dtype=np.int64),
            lengths=self._cs_lengths,
            world_size=plan.world_size,
            per_device_batch_size=plan.per_device_batch_size,
            seed=self.cluster_config.seed,
            balance_tokens=self.cluster_config.balance_tokens,
            window=self.cluster_config.balance_window,
            num_batches=num_batches,
        )
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
        config, plan = self.cluster_config, self.step_plan or self.plan()
        model = self.accelerator.unwrap_model(model if model is not None else self.model)
        callback = self.cluster_callback
        n = plan.n_examples
        dataset, collator = self._cs_feature_view()
        local = distributed.shard_indices(n, self.args.world_size, self.args.process_index)
        callback.start("features")
        projection = None
        if config.projection_dim is not None:
            hidden = model.get_output_embeddings().weight.shape[1] if model.get_output_embeddings() is not None else None
            projection = RandomProjection(hidden, config.projection_dim, seed=config.seed) if hidden else None
        output = last_layer_grad_features(
            model,
            dataset,
            local,
            collator,
            batch_size=config.feature_batch_size or self.args.per_device_eval_batch_size,
            lengths=[int(self._cs_lengths[i]) for i in local],
            projection=projection,
            show_progress=self.is_world_process_zero() and not self.args.disable_tqdm,
        )
        features = distributed.gather_rows(output.features, local, n)
        loss_tokens = distributed.gather_rows(output.loss_tokens.reshape(-1, 1), local, n).reshape(-1).numpy()
        check_loss_tokens(loss_tokens)
        callback.stop("features")
        callback.start("clustering")
        payload = None
        if distributed.rank() == 0:
            result = cluster_features(features.numpy(), config, world_size=plan.world_size, loss_tokens=loss_tokens)
            chosen = select_subset(result, config)
            report = SelectionReport.from_results(
                result,
                chosen,
                config,
                tokens_total=int(loss_tokens.sum()),
                tokens_kept=int(loss_tokens[chosen.indices].sum()),
                token_kind="loss",
                world_size=plan.world_size,
                per_device_train_batch_size=plan.per_device_batch_size,
                gradient_accumulation_steps=plan.gradient_accumulation_steps,
                warmup_steps=plan.warmup_steps,
                selected_steps=plan.selected_steps,
                full_data_steps=plan.full_data_steps,
            )
            payload = (chosen, result.labels, result.raw_labels, report)
        chosen, labels, raw_labels, report = distributed.broadcast_object(payload)
        callback.stop("clustering")
        report.warmup_seconds = callback.measured("warmup")
        report.features_seconds = callback.measured("features")
        report.clustering_seconds = callback.measured("clustering")
        report.selection_seconds = report.features_seconds + report.clustering_seconds
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
        sampler = ClusterBatchSampler(
            indices=selection.indices,
            labels=selection.labels,
            lengths=self._cs_lengths[selection.indices],
            world_size=plan.world_size,
            per_device_batch_size=plan.per_device_batch_size,
            seed=config.seed,
            balance_tokens=config.balance_tokens,
            window=config.balance_window,
            allocation=config.allocation,
        )
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

    # ---- report, persistence, model card ------------------------------------------------------------------
    def finalize_selection_report(self, measured_full_seconds: float | None = None) -> SelectionReport:
        """Fill the report's training time and the savings estimate from what the callback measured.

        Args:
            measured_full_seconds (`float`, *optional*): wall seconds of a measured full-data run of the same
                recipe; without it the full-data time is estimated from the measured warm-up throughput.
        Returns:
            `SelectionReport` (also stored as `self.selection_report`).
        """
        report, callback = self.selection_report, self.cluster_callback
        report.warmup_seconds = callback.measured("warmup") or 0.0
        report.training_seconds = callback.measured("training") or 0.0
        report.total_seconds = None
        report.apply_savings(measured_full_seconds)
        return self.selection_report

    def save_cluster_selection(self, folder: str) -> str | None:
        """Write the selection (indices, weights, labels, config, data fingerprint, report) into `folder`
        atomically; nothing before selection. Returns the path written, or `None`."""
        if self.selection is None:
            return None
        return save_selection(
            folder,
            self.selection,
            labels=self._cs_labels,
            raw_labels=self._cs_raw_labels,
            config=self.cluster_config.to_dict(),
            fingerprint=data_fingerprint(self._cs_lengths),
            extra={"report": self.selection_report.to_dict() if self.selection_report else None},
        )

    def write_selection_card(self, output_dir: str) -> str | None:
        """Add the selection section and cluster-size plot to `output_dir/README.md` (keeping what is there)."""
        if self.selection_report is None:
            return None
        plot_cluster_sizes(self.selection_report, os.path.join(output_dir, PLOT_FILENAME))
        base = getattr(getattr(self.model, "config", None), "_name_or_path", None)
        return write_model_card(output_dir, self.selection_report, base_model=base, plot_filename=PLOT_FILENAME)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """The parent's model card, then the selection section appended (rank 0)."""
        super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            self.write_selection_card(self.args.output_dir)
