"""Figures of a selection (layer L2). matplotlib is imported lazily and used through its object-oriented API with
the Agg canvas, so that plotting never changes the caller's pyplot backend or global state."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..atomic import atomic_open


def _values(report: Any) -> Mapping[str, Any]:
    """A `SelectionReport` (anything with `to_dict`) or its dictionary, as a mapping."""
    return report if isinstance(report, Mapping) else report.to_dict()


def plot_cluster_sizes(report: Any, path: str | os.PathLike, *, dpi: int = 120) -> str:
    """Bar chart of every cluster's full-data size next to the number of its examples kept; saved as PNG.

    Args:
        report (`SelectionReport` or its `to_dict()`): needs `cluster_sizes`, `kept_per_cluster`, `n_examples`,
            `n_kept`, `fraction_kept`, `n_clusters` and `n_noise`.
        path (`str` or `os.PathLike`): PNG file to write (atomically: temporary file in the same folder, then
            `os.replace`); its folder is created if missing.
        dpi (`int`, *optional*, defaults to `120`): resolution of the image, in dots per inch.
    Returns:
        `str`: `path`.
    Raises:
        ValueError: if the report has no cluster sizes or `kept_per_cluster` has a different length.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    values = _values(report)
    sizes = [int(v) for v in values.get("cluster_sizes") or []]
    kept = [int(v) for v in values.get("kept_per_cluster") or []]
    if not sizes or len(kept) != len(sizes):
        raise ValueError(
            f"`cluster_sizes` (length {len(sizes)}) and `kept_per_cluster` (length {len(kept)}) must be non-empty "
            "and of equal length to plot."
        )
    n_clusters = len(sizes)
    positions = list(range(n_clusters))
    width = 0.4
    fig = Figure(figsize=(max(6.0, min(14.0, 0.25 * n_clusters + 3.0)), 4.5), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar([p - width / 2 for p in positions], sizes, width, label="full data", color="#9db4d3")
    ax.bar([p + width / 2 for p in positions], kept, width, label="kept", color="#d8572a")
    fraction = float(values.get("fraction_kept") or 0.0)
    method = values.get("clustering_method") or "clustering"
    ax.set_title(
        f"Kept {int(values.get('n_kept', sum(kept))):,} of {int(values.get('n_examples', sum(sizes))):,} examples "
        f"({fraction:.1%})\n{method}: {n_clusters} clusters; "
        f"examples labelled noise before assignment: {int(values.get('n_noise') or 0):,}",
        fontsize=10,
    )
    ax.set_xlabel("Cluster")
    ax.set_ylabel("Examples")
    ax.set_xlim(-0.6, n_clusters - 0.4)
    step = max(1, n_clusters // 30)
    ax.set_xticks(positions[::step])
    ax.set_xticklabels([str(p) for p in positions[::step]], fontsize=8)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return save_png(fig, path)


def save_png(fig: Any, path: str | os.PathLike) -> str:
    """Lay out a matplotlib `Figure` and write it as PNG atomically (temporary file, then `os.replace`); returns
    `path`."""
    fig.tight_layout()
    path = os.fspath(path)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png")
    return path
