"""The report, selection file and model card of a ClusterTrainer run (layer L4): `SelectionOutputsMixin`."""

from __future__ import annotations

from typing import Any

from ..reporting.model_card import scrub_card
from ..reporting.outputs import write_report_files, write_selection_card
from ..reporting.report import SelectionReport


def savings_metrics(report: SelectionReport) -> dict[str, float]:
    """The time figures of `report.summary_metrics()` (seconds and savings), as logged and carded."""
    return {k: v for k, v in report.summary_metrics().items() if "seconds" in k or "saved" in k}


class SelectionOutputsMixin:
    """What `ClusterSelectMixin` writes: the finalized report, the selection file, the card section; and no local
    path left as `base_model` in any card a save wrote. Reads `self.selection_run` (set by `ClusterSelectMixin`)."""

    def finalize_selection_report(self, measured_full_seconds: float | None = None) -> SelectionReport | None:
        """`SelectionRun.finalize_report`: training seconds and savings (measured with `measured_full_seconds`).

        With a measured time, the final figures are logged once more to the run's `report_to` backends, under the
        names the card uses: `cluster_select/full_data_seconds_measured`, `seconds_saved_measured`,
        `fraction_saved_measured` (the estimate logged at the end of training stays, named `*_estimated`).
        """
        if self.selection_run is None:
            return None
        report = self.selection_run.finalize_report(measured_full_seconds)
        if report is not None and measured_full_seconds is not None:
            self.log(savings_metrics(report))
        return report

    def latest_eval_metrics(self) -> dict | None:
        """The newest `eval_*` entry of `state.log_history` (its `eval_*` values and `step`), or `None`."""
        for entry in reversed(getattr(self.state, "log_history", None) or []):
            metrics = {k: v for k, v in entry.items() if k.startswith("eval_") and isinstance(v, (int, float))}
            if metrics:
                return dict(metrics, step=entry.get("step"))
        return None

    def _cs_card_report(self) -> tuple[SelectionReport, str | None]:
        """The report as the card shows it (the run's latest `eval_*` metrics copied in) and the base model name."""
        report = self.selection_report
        report.eval_metrics = self.latest_eval_metrics()
        return report, getattr(getattr(self.model, "config", None), "_name_or_path", None)

    def write_selection_outputs(self, output_dir: str) -> None:
        """At the end of training (rank 0): `selection_report.json`, the plots, the card section and the selection
        file (`cluster_selection.npz`) in `output_dir`."""
        if self.selection_report is None:
            return
        write_report_files(output_dir, *self._cs_card_report())
        self.selection_run.save(output_dir)

    def write_selection_card(self, output_dir: str) -> str | None:
        """Add the selection section and cluster-size plot to `output_dir/README.md` (keeping what is there)."""
        if self.selection_report is None:
            return None
        return write_selection_card(output_dir, *self._cs_card_report())

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """The parent's model card, then the selection section appended (rank 0)."""
        super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            self.write_selection_card(self.args.output_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The parent's `save_model` (also what every checkpoint calls), then no local path left as `base_model` in
        the card it wrote (PEFT writes `base_model: /local/folder`, which the Hub rejects)."""
        super().save_model(output_dir, _internal_call=_internal_call)
        if self.is_world_process_zero():
            scrub_card(output_dir if output_dir is not None else self.args.output_dir)
