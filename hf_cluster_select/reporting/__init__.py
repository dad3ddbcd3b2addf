"""Reporting stage (layer L2): the measured `SelectionReport`, the model card section, plots and output files."""

from .outputs import PLOT_FILENAME, REPORT_FILENAME, write_report_files, write_selection_card
from .report import SelectionReport
from .savings import estimate_savings

__all__ = ["PLOT_FILENAME", "REPORT_FILENAME", "SelectionReport", "estimate_savings", "write_report_files",
           "write_selection_card"]
