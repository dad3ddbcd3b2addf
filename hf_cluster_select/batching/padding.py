"""Padded tokens per batch (layer L2): what a training step costs, for the full-data time estimate.

A step's cost grows with the padded tokens of its batches (examples × the longest in each batch). The stock
`Trainer` draws random batches of `per_device_train_batch_size` and pads each to its longest example;
ClusterTrainer's subset epochs follow the batch plan. `estimate_savings` scales the selected steps' measured time
by the ratio of the two (`SelectionReport.length_ratio`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def plan_padded_tokens(lengths: np.ndarray, batches: Sequence[Sequence[int]]) -> float:
    """Mean padded tokens of `batches` (positions into `lengths` `[m]`): mean of `len(batch) × max length`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    sizes = [len(b) * int(lengths[np.asarray(b, dtype=np.int64)].max()) for b in batches if len(b)]
    return float(np.mean(sizes)) if sizes else 0.0


def random_batch_padded_tokens(lengths: np.ndarray, batch_size: int, seed: int, epochs: int = 4) -> float:
    """Mean padded tokens of the stock sampler's batches: `epochs` seeded random permutations of `lengths` `[n]`
    cut into batches of `batch_size` (the last one smaller), each padded to its longest example."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng([seed, 5])
    sizes = []
    for _ in range(epochs):
        order = rng.permutation(lengths.size)
        for start in range(0, order.size, batch_size):
            part = lengths[order[start: start + batch_size]]
            sizes.append(part.size * int(part.max()))
    return float(np.mean(sizes))
