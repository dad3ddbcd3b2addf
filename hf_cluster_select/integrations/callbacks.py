"""ClusterSelectCallback: token balance, checkpointing of the selection, report and model card (layer L4).

The trainer gives itself to the callback's constructor (callbacks never see the trainer otherwise). The callback
counts padded tokens per rank (`TokenBalanceMeter`), exports the run's measured seconds into every checkpoint
(`ExportableState`), writes the selection next to each checkpoint, and when training ends logs the savings through
the Trainer's `log` (so every `report_to` backend gets them) and, on rank 0, writes `selection_report.json`, the
cluster-size plot and the model card section. It reaches the run only through `trainer.selection_run`.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..batching.meter import TokenBalanceMeter
from .outputs import savings_metrics


class ClusterSelectCallback(TrainerCallback, ExportableState):
    """Measures and publishes a ClusterTrainer run. Attached by `ClusterTrainer` itself; users need not add it.

    Measured wall seconds live in the run's `PhaseClock` (`warmup`, `features`, `clustering`, `training`) and are
    saved in every checkpoint's trainer state, so a resumed run keeps counting.

    Token balance: `token_meter` (`TokenBalanceMeter`) counts the padded tokens of every trained micro-batch (the
    trainer calls `record_tokens` from `compute_loss`) and exchanges the per-rank totals at every optimizer step
    (`on_step_end`, all ranks); the trainer adds its means to each training log as
    `cluster_select/max_tokens_per_rank`, `cluster_select/mean_tokens_per_rank`, `cluster_select/max_over_mean_tokens`.

    Args:
        trainer (`ClusterTrainer`, *optional*): the trainer it reports on; re-attached by the trainer on resume.
    """

    def __init__(self, trainer: Any = None) -> None:
        self.trainer = trainer
        self.token_meter = TokenBalanceMeter()

    def _run(self):
        return None if self.trainer is None else self.trainer.selection_run

    # ---- state saved in checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict:
        """`ExportableState`: the seconds measured so far, saved in every checkpoint's trainer state."""
        run = self._run()
        return {"args": {}, "attributes": {"seconds": run.clock.snapshot() if run is not None else {}}}

    @classmethod
    def saved_seconds(cls, stateful_callbacks: dict) -> dict[str, float]:
        """The seconds a checkpoint's `TrainerState.stateful_callbacks` recorded for this callback (`{}` if none)."""
        saved = stateful_callbacks.get(cls.__name__)
        return dict(saved.get("attributes", {}).get("seconds", {})) if isinstance(saved, dict) else {}

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
        run = self._run()
        if run is not None and state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                run.save(folder)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """Finish the report: log the savings and, on rank 0, write report JSON, selection, plot and model card."""
        run = self._run()
        if run is None or run.report is None:
            return control
        self.trainer.log(savings_metrics(run.finalize_report()))
        if state.is_world_process_zero:
            self.trainer.write_selection_outputs(args.output_dir)
        return control
