"""Argument checks shared by the array-level stages (layer L0: numpy only)."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value` as a Python int.

    Raises:
        ValueError: if `value` is a bool, not an integer, or below `minimum`; the message names `name`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_int_array(name: str, value: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """`value` as a 1-D int64 array with at least one entry (and the given `shape`).

    Raises:
        ValueError: if it is not 1-D, empty, not of an integer dtype, or not of `shape`; the message names `name`.
    """
    array = np.asarray(value)
    if array.ndim != 1 or array.shape[0] < 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"`{name}` must be a 1-D int array with at least one entry, got shape {array.shape}, "
                         f"dtype {array.dtype}.")
    if shape is not None and array.shape != shape:
        raise ValueError(f"`{name}` must have the shape of `labels` {shape}, got {array.shape}.")
    return array.astype(np.int64)
