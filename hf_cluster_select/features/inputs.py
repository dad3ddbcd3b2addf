"""Checked inputs and token-budget batches of the feature pass (layer L2).

`validate_inputs` checks `feature_pass`'s arguments before any model work; `token_batches` packs examples sorted
by length into batches of about the same padded tokens, so the forward-only pass wastes almost nothing on padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

MAX_BATCH_MULTIPLE = 4  # a batch of short examples holds at most this many times `batch_size` examples


def validate_inputs(model, dataset, indices, collate_fn, batch_size, lengths,
                    projection) -> tuple[list[int], list[int]]:
    """Check `feature_pass`'s arguments before any model work; returns `(indices, lengths)` as lists of ints
    (lengths read from `dataset[i]["input_ids"]` when not given).

    Raises:
        TypeError, ValueError: naming the argument and what was expected.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}.")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"`dataset` must be a map-style dataset (len and [i]), got {type(dataset).__name__}.")
    if not callable(collate_fn):
        raise TypeError(f"`collate_fn` must be callable, got {type(collate_fn).__name__}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"`batch_size` must be an int, got {batch_size!r}.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
    if projection is not None and not callable(projection):
        raise TypeError(f"`projection` must be callable or None, got {type(projection).__name__}.")
    if isinstance(indices, (torch.Tensor, np.ndarray)):
        indices = indices.tolist()
    if not isinstance(indices, Sequence) or isinstance(indices, (str, bytes)):
        raise TypeError(f"`indices` must be a sequence of ints, got {type(indices).__name__}.")
    indices = list(indices)
    if not indices:
        raise ValueError("`indices` is empty: give at least one dataset index.")
    size = len(dataset)
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"`indices` must hold ints, got {i!r}.")
        if not 0 <= i < size:
            raise ValueError(f"`indices` holds {i}, outside the dataset's range [0, {size}).")
    indices = [int(i) for i in indices]
    if lengths is None:
        lengths = []
        for i in indices:
            item = dataset[i]
            if not isinstance(item, Mapping) or "input_ids" not in item:
                raise ValueError(f"dataset item {i} has no `input_ids`; pass `lengths` explicitly.")
            lengths.append(len(item["input_ids"]))
    else:
        if isinstance(lengths, (torch.Tensor, np.ndarray)):
            lengths = lengths.tolist()
        lengths = list(lengths)
        if len(lengths) != len(indices):
            raise ValueError(f"`lengths` must have one entry per index ({len(indices)}), got {len(lengths)}.")
        if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in lengths):
            raise ValueError("`lengths` must hold non-negative ints.")
    return indices, [int(x) for x in lengths]


def token_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Positions `0..n-1` into `lengths` packed longest-first under a padded-token budget.

    The budget is `batch_size` × the longest length (what a fixed-size first batch would hold); each batch takes the
    next examples in length order while `examples × longest-in-batch` stays within it, and at most
    `MAX_BATCH_MULTIPLE · batch_size` examples. Sorted lengths make padding small; long examples come first, so an
    out-of-memory error shows at once.

    Args:
        lengths (sequence of `int`, length `n`): tokens per example (>= 0).
        batch_size (`int`): examples in a batch of the longest examples, >= 1.
    Returns:
        `list[list[int]]`: the batches as positions into `lengths`, every position exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])  # stable
    if not order:
        return []
    budget = batch_size * max(1, lengths[order[0]])
    cap = MAX_BATCH_MULTIPLE * batch_size
    batches, current, width = [], [], 0
    for k in order:
        grown = max(width, lengths[k], 1)
        if current and (len(current) + 1 > cap or (len(current) + 1) * grown > budget):
            batches.append(current)
            current, grown = [], max(lengths[k], 1)
        current.append(k)
        width = grown
    batches.append(current)
    return batches
