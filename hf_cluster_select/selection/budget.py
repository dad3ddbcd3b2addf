"""The exact selection budget (layer L2): how many examples a `data_fraction` keeps."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import numpy as np


def selection_budget(n_total: int, data_fraction: float) -> int:
    """Number of examples to keep: `max(1, round_half_up(data_fraction · n_total))`.

    The product is rounded half up on the decimal value of `data_fraction` as written (`repr`), so `0.35 · 10` gives
    4 although the binary float product is 3.4999…; Python's `round` (half to even, binary) is not used.

    Args:
        n_total (`int`): number of examples to choose from, >= 1.
        data_fraction (`float`): share to keep, in (0, 1].
    Returns:
        `int`: the budget m, with 1 <= m <= n_total.
    Raises:
        ValueError: if `n_total` < 1 or `data_fraction` is outside (0, 1].
        TypeError: if `data_fraction` is not a number.
    """
    if isinstance(n_total, bool) or not isinstance(n_total, (int, np.integer)) or n_total < 1:
        raise ValueError(f"`n_total` must be an int >= 1, got {n_total!r}.")
    if isinstance(data_fraction, bool) or not isinstance(data_fraction, (int, float, np.floating)):
        raise TypeError(f"`data_fraction` must be a float in (0, 1], got {data_fraction!r}.")
    if not 0.0 < float(data_fraction) <= 1.0:
        raise ValueError(f"`data_fraction` must be in (0, 1], got {data_fraction!r}.")
    exact = Decimal(repr(float(data_fraction))) * int(n_total)
    return max(1, min(int(n_total), int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))))
