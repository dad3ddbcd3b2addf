"""Dataset views the trainer needs: example indices carried through the collator, and token lengths (layer L2)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

INDEX_KEY = "cluster_select_index"


class IndexedDataset(Dataset):
    """Wraps a map-style dataset of dict examples so each example also carries its index under `INDEX_KEY`.

    Args:
        dataset (map-style dataset of `dict`): the training data (e.g. a `datasets.Dataset`).
    Raises:
        TypeError: on access, if an example is not a mapping.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        example = self.dataset[index]
        if not hasattr(example, "keys"):
            raise TypeError(f"training examples must be dicts of features, got {type(example).__name__}.")
        return {**example, INDEX_KEY: int(index)}


class IndexCollator:
    """Calls the user's collator on examples stripped of `INDEX_KEY`, then adds the indices to the batch as an
    int64 tensor of shape `[batch]` (popped again by `ClusterTrainer.compute_loss` before the model sees it).

    Args:
        collator (`Callable[[list[dict]], dict]`): the trainer's data collator.
    """

    def __init__(self, collator: Callable[[list[dict]], dict]) -> None:
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        stripped, indices = [], []
        for example in examples:
            example = dict(example)
            indices.append(example.pop(INDEX_KEY))
            stripped.append(example)
        batch = self.collator(stripped)
        batch[INDEX_KEY] = torch.tensor(indices, dtype=torch.int64)
        return batch


def example_lengths(dataset: Any, key: str = "input_ids") -> np.ndarray:
    """Token length of every example (`len(example[key])`), used for token balance and batching by length.

    Args:
        dataset (map-style dataset of `dict`): tokenized examples.
        key (`str`, *optional*, defaults to `"input_ids"`): the token column.
    Returns:
        `np.ndarray` of shape `[n_examples]`, int64, every entry >= 1.
    Raises:
        ValueError: if examples have no `key` column (the dataset is not tokenized).
    """
    column_names = getattr(dataset, "column_names", None)
    if column_names is not None:
        if key not in column_names:
            raise ValueError(
                f"`train_dataset` has no {key!r} column (columns found: {sorted(column_names)}); tokenize it first."
            )
        values = dataset.with_format(None)[key] if hasattr(dataset, "with_format") else dataset[key]
        lengths = [len(v) for v in values]
    else:
        lengths = []
        for i in range(len(dataset)):
            example = dataset[i]
            if key not in example:
                raise ValueError(
                    f"example {i} of `train_dataset` has no {key!r} (keys found: {sorted(example)}); tokenize it first."
                )
            lengths.append(len(example[key]))
    return np.maximum(np.asarray(lengths, dtype=np.int64), 1)
