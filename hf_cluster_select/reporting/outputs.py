"""The files a finished selection run publishes in `output_dir` (layer L2).

`selection_report.json` (`SelectionReport`), `cluster_sizes.png` (`plots.plot_cluster_sizes`), `feature_map.png`
(`feature_map.plot_feature_map`) and the model card
section in `README.md` (`model_card.write_model_card`, keeping what Trainer / TRL / PEFT wrote there).
"""

from __future__ import annotations

import os

from .feature_map import plot_feature_map
from .model_card import write_model_card
from .plots import plot_cluster_sizes
from .report import SelectionReport

REPORT_FILENAME = "selection_report.json"
PLOT_FILENAME = "cluster_sizes.png"
MAP_FILENAME = "feature_map.png"


def write_selection_card(output_dir: str, report: SelectionReport, base_model: str | None = None) -> str:
    """Write the cluster-size plot, the 2-D feature map (when the report has one) and the model card section into
    `output_dir` (atomically).

    Args:
        output_dir (`str`): existing folder of the trained model.
        report (`SelectionReport`): the measured record of the selection.
        base_model (`str`, *optional*): the model's `_name_or_path`; kept in the card only when it is a Hub id.
    Returns:
        `str`: path of the card (`README.md`).
    """
    plot_cluster_sizes(report, os.path.join(output_dir, PLOT_FILENAME))
    drawn = plot_feature_map(report, os.path.join(output_dir, MAP_FILENAME))
    return write_model_card(output_dir, report, base_model=base_model, plot_filename=PLOT_FILENAME,
                            map_filename=MAP_FILENAME if drawn else None)


def write_report_files(output_dir: str, report: SelectionReport, base_model: str | None = None) -> str:
    """`selection_report.json`, then `write_selection_card`; creates `output_dir` if needed.

    Returns:
        `str`: path of the report JSON.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, REPORT_FILENAME)
    report.save(path)
    write_selection_card(output_dir, report, base_model)
    return path
