"""Argument checks shared by the array-level stages (layer L0: numpy only)."""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value` as a Python int.

    Raises:
        ValueError: if `value` is a bool, not an integer, or below `minimum`; the message names `name`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_real(name: str, value: Any, in_range: Callable[[float], bool], expected: str) -> float:
    """`value` as a Python float.

    Args:
        name (`str`): the argument or setting, named in the message.
        value: a real number (Python or numpy; not a bool).
        in_range (callable): whether the number is allowed.
        expected (`str`): what is allowed, for the message (`"a finite number > 0"`).
    Raises:
        ValueError: `"`name` must be <expected>, got <value>."` for a bool, a non-number or a number out of range.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not in_range(value):
        raise ValueError(f"`{name}` must be {expected}, got {value!r}.")
    return float(value)


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
