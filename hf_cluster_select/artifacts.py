"""The published artefacts of a selection: report, selection file, plot, model card (layer L4 base class).

`ClusterSelectMixin` inherits these public methods; they read the trainer's selection state and write files
(atomically, rank-0 guarding is the caller's job except in `create_model_card`).
"""

from __future__ import annotations

import os
from typing import Any

from .callbacks import PLOT_FILENAME
from .model_card import write_model_card
from .persistence import data_fingerprint, save_selection
from .plots import plot_cluster_sizes
from .report import SelectionReport


class SelectionArtifactsMixin:
    """Report, persistence and model-card methods of `ClusterSelectMixin` (needs its attributes `selection`,
    `selection_report`, `cluster_callback`, `cluster_config`, `_cs_labels`, `_cs_raw_labels`, `_cs_lengths`)."""


    def finalize_selection_report(self, measured_full_seconds: float | None = None) -> SelectionReport:
        """Fill the report's training time and the savings estimate from what the callback measured.

        Args:
            measured_full_seconds (`float`, *optional*): wall seconds of a measured full-data run of the same
                recipe; without it the full-data time is estimated from this run's measured seconds per step.
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
