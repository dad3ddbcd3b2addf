"""A 2-D map of the feature space: PCA of a seeded sample of the L2-normalised features (layer L2).

`feature_map_points` runs where the features are (rank 0, right after clustering) and keeps only the sample's
coordinates, which go into the report (`SelectionReport.feature_map`), so the map can be drawn later, from a
checkpoint's report too; `plot_feature_map` draws it coloured by cluster, kept examples marked.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .plots import save_png

MAX_MAP_POINTS = 3000


def feature_map_points(features: Any, seed: int, max_points: int = MAX_MAP_POINTS) -> dict | None:
    """2-D PCA coordinates of up to `max_points` examples (seeded sample of the rows with finite, non-zero features).

    Args:
        features (array of shape `[n_examples, dim]`): the features clustered (memory-mapped is fine: only the
            sampled rows are read).
        seed (`int`): seed of the sample and of the PCA.
        max_points (`int`, *optional*): most examples on the map.
    Returns:
        `dict` with `indices` (dataset indices), `x`, `y` (PCA coordinates of the normalised rows) and
        `explained_variance_ratio` (2 floats, share of the sample's variance each axis holds), or `None` when
        fewer than 3 rows are usable.
    """
    from sklearn.decomposition import PCA

    n = int(features.shape[0])
    rng = np.random.default_rng(seed)
    candidates = np.sort(rng.choice(n, size=min(n, 4 * max_points), replace=False)) if n else np.zeros(0, int)
    rows = np.asarray(features[candidates], dtype=np.float64).reshape(candidates.size, -1)
    norms = np.linalg.norm(rows, axis=1)
    usable = np.isfinite(rows).all(axis=1) & (norms > 0)
    candidates, rows, norms = candidates[usable][:max_points], rows[usable][:max_points], norms[usable][:max_points]
    if candidates.size < 3 or rows.shape[1] < 2:
        return None
    pca = PCA(n_components=2, random_state=seed)
    xy = pca.fit_transform(rows / norms[:, None])
    return {"indices": candidates.tolist(), "x": xy[:, 0].round(5).tolist(), "y": xy[:, 1].round(5).tolist(),
            "explained_variance_ratio": [round(float(v), 5) for v in pca.explained_variance_ratio_]}


def plot_feature_map(report: Any, path: str | os.PathLike, *, dpi: int = 120) -> str | None:
    """Scatter plot of `report.feature_map`, each point coloured by its cluster, kept examples drawn larger with a
    black edge; saved as PNG (atomically). Returns `path`, or `None` when the report has no map.

    Args:
        report (`SelectionReport` or its `to_dict()`): needs `feature_map`, `labels` and `kept_indices`.
        path (`str` or `os.PathLike`): the PNG to write.
        dpi (`int`, *optional*, defaults to `120`): resolution, in dots per inch.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = report if isinstance(report, dict) else report.to_dict()
    points = values.get("feature_map")
    labels = values.get("labels") or []
    if not points or not labels:
        return None
    index = np.asarray(points["indices"], dtype=np.int64)
    x, y = np.asarray(points["x"]), np.asarray(points["y"])
    cluster = np.asarray(labels, dtype=np.int64)[index]
    kept = np.isin(index, np.asarray(values.get("kept_indices") or [], dtype=np.int64))
    fig = Figure(figsize=(7.0, 6.0), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = matplotlib.colormaps["tab20"]
    ax.scatter(x[~kept], y[~kept], c=[cmap(c % 20) for c in cluster[~kept]], s=8, alpha=0.45, linewidths=0,
               label="not kept")
    ax.scatter(x[kept], y[kept], c=[cmap(c % 20) for c in cluster[kept]], s=26, edgecolors="black",
               linewidths=0.6, label="kept")
    ratio = points.get("explained_variance_ratio") or [0.0, 0.0]
    ax.set_xlabel(f"PC 1 ({ratio[0]:.0%} of the variance)")
    ax.set_ylabel(f"PC 2 ({ratio[1]:.0%} of the variance)")
    ax.set_title(f"Features, 2-D PCA: {index.size:,} of {len(labels):,} examples, coloured by cluster "
                 f"({int(values.get('n_clusters') or 0):,} clusters; colours repeat every 20)", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    return save_png(fig, path)
