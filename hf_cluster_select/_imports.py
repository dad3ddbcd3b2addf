"""Checks for optional or fragile dependencies (layer L0: imports nothing from the package).

Heavy or compiled dependencies are imported lazily, inside the function that needs them, so that
`import hf_cluster_select` works even where they are missing or broken.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require_hdbscan() -> ModuleType:
    """Import and return the `hdbscan` module (HDBSCAN, Campello et al. 2013; McInnes et al. 2017).

    Returns:
        `ModuleType`: the imported `hdbscan` module.
    Raises:
        ImportError: if `hdbscan` is not installed or fails to import with any exception (often a compiled
            extension built against another numpy), with instructions to fix it and the `cluster_method="kmeans"`
            fallback.
    """
    try:
        return importlib.import_module("hdbscan")
    except ImportError as error:  # missing package, or a broken compiled extension
        detail = f"{type(error).__name__}: {error}"
    except Exception as error:  # e.g. ValueError "numpy.dtype size changed, may indicate binary incompatibility"
        detail = f"{type(error).__name__}: {error}"
    raise ImportError(
        "hf_cluster_select needs the `hdbscan` package for cluster_method='hdbscan' but could not import it "
        f"({detail}). Fix: `pip install hdbscan` (wheels exist for CPython 3.10-3.12 on Linux/macOS). If it is "
        "installed and the error mentions binary incompatibility or `numpy.dtype size changed`, reinstall it "
        "against your numpy: `pip install --force-reinstall --no-cache-dir hdbscan`. Or avoid it with "
        "ClusterSelectConfig(cluster_method='kmeans')."
    )


def is_hdbscan_available() -> bool:
    """Whether `hdbscan` imports cleanly (never raises)."""
    try:
        require_hdbscan()
    except ImportError:
        return False
    return True
