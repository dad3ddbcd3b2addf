"""ClusterSelectCallback: timing, logging, checkpointing of the selection, report and model card (layer L3).

The trainer gives itself to the callback's constructor (callbacks never see the trainer otherwise) and marks
the phase boundaries it alone knows (warm-up, features, clustering, selected-data training); the callback owns the
clock, logs `cluster_select/*` through the Trainer's `log` (so every `report_to` backend gets them), writes the
selection into each checkpoint, and on rank 0 writes `selection_report.json`, the cluster-size plot and the model
card section when training ends.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .balance import TokenBalanceMeter

REPORT_FILENAME = "selection_report.json"
PLOT_FILENAME = "cluster_sizes.png"


class ClusterSelectCallback(TrainerCallback, ExportableState):
    """Measures and publishes a ClusterTrainer run. Attached by `ClusterTrainer` itself; users need not add it.

    Measured wall seconds (`time.perf_counter`), accumulated across resumes through `ExportableState`:
    `warmup_seconds` (optimizer steps on the full data), `features_seconds`, `clustering_seconds` (clustering and
    choosing the subset), `training_seconds` (optimizer steps on the subset).

    Token balance: `token_meter` (`TokenBalanceMeter`) counts the padded tokens of every trained micro-batch (the
    trainer calls `record_tokens` from `compute_loss`) and exchanges the per-rank totals at every optimizer step
    (`on_step_end`, all ranks); the trainer adds its means to each training log as
    `cluster_select/max_tokens_per_rank`, `cluster_select/mean_tokens_per_rank`, `cluster_select/max_over_mean_tokens`.

    Args:
        trainer (`ClusterTrainer`, *optional*): the trainer it reports on; re-attached by the trainer on resume.
    """

    PHASES = ("warmup", "features", "clustering", "training")

    def __init__(self, trainer: Any = None) -> None:
        self.trainer = trainer
        self.seconds: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self.token_meter = TokenBalanceMeter()

    # ---- timing -------------------------------------------------------------------------------------------
    def start(self, phase: str) -> None:
        """Start (or continue) the clock of `phase` (one of `PHASES`)."""
        if phase not in self.PHASES:
            raise ValueError(f"`phase` must be one of {self.PHASES}, got {phase!r}.")
        self._started[phase] = time.perf_counter()

    def stop(self, phase: str) -> float:
        """Stop the clock of `phase`; returns its accumulated seconds."""
        began = self._started.pop(phase, None)
        if began is not None:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - began
        return self.seconds.get(phase, 0.0)

    def measured(self, phase: str) -> float | None:
        """Seconds measured for `phase` so far (a running clock included), `None` if it never ran."""
        running = self._started.get(phase)
        if running is None:
            return self.seconds.get(phase)
        return self.seconds.get(phase, 0.0) + time.perf_counter() - running

    def snapshot(self) -> dict[str, float]:
        """Seconds measured so far for every phase that ran."""
        return {phase: self.measured(phase) for phase in self.PHASES if self.measured(phase) is not None}

    def restore(self, seconds: dict[str, float]) -> None:
        """Continue from the seconds a checkpoint recorded (on resume)."""
        self.seconds = {phase: float(value) for phase, value in seconds.items() if phase in self.PHASES}

    def state(self) -> dict:
        """`ExportableState`: the seconds measured so far, saved in every checkpoint's trainer state."""
        return {"args": {}, "attributes": {"seconds": self.snapshot()}}

    # ---- token balance ------------------------------------------------------------------------------------
    def record_tokens(self, tokens: int) -> None:
        """Count one trained micro-batch of `tokens` padded tokens on this rank."""
        self.token_meter.add(tokens)

    def token_metrics(self) -> dict[str, float]:
        """Token-balance means since the last call (empty if no optimizer step ended since)."""
        return self.token_meter.pop_metrics()

    # ---- Trainer events -----------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        """Start token counting afresh."""
        self.token_meter.reset()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        """Close the step's token count: one tiny all-gather of per-rank totals (every rank reaches this hook)."""
        self.token_meter.end_step()
        return control

    def on_save(self, args, state, control, **kwargs):
        """Write the selection next to the checkpoint just saved (rank 0; atomic)."""
        if self.trainer is not None and state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                self.trainer.save_cluster_selection(folder)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """Finish the report: log the savings and, on rank 0, write report JSON, plot and model card."""
        trainer = self.trainer
        if trainer is None or trainer.selection_report is None:
            return control
        report = trainer.finalize_selection_report()
        trainer.log({k: v for k, v in report.summary_metrics().items() if "seconds" in k or "saved" in k})
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            report.save(os.path.join(args.output_dir, REPORT_FILENAME))
            trainer.save_cluster_selection(args.output_dir)
            trainer.write_selection_card(args.output_dir)
        return control
