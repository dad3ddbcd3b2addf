"""The one definition of a loss-bearing label (layer L0: numpy only).

A label equal to `IGNORE_INDEX` (-100, PyTorch's `cross_entropy` default and transformers' convention) carries no
loss. For a causal language model position `t` predicts `labels[t + 1]`, so `labels[0]` never carries loss
(`shift=True`); encoder-decoder and classification labels are not shifted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

IGNORE_INDEX = -100


def loss_token_mask(labels: Any, *, shift: bool) -> np.ndarray:
    """Which labels of one example carry loss.

    Args:
        labels (`int`, or array-like of shape `[seq_len]`): one class id, or one example's token labels.
        shift (`bool`): causal LM — the first label is never scored.
    Returns:
        `np.ndarray` of bool, shape `[seq_len]` (`[1]` for a class id); with `shift`, entry 0 is always False.
    """
    values = np.asarray(labels).reshape(-1)
    mask = values != IGNORE_INDEX
    if shift and np.ndim(labels) > 0 and mask.size:
        mask[0] = False
    return mask


def has_loss_token(labels: Any, *, shift: bool) -> bool:
    """Whether one example carries any loss (see `loss_token_mask`); `None` labels count as carrying loss."""
    if labels is None:
        return True
    return bool(loss_token_mask(labels, shift=shift).any())
