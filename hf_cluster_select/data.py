"""Dataset views the trainer needs: example indices carried through the collator, and token lengths (layer L2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from .loss_tokens import IGNORE_INDEX, loss_token_mask

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
        ValueError: if examples are not dicts or have no `key` column (the dataset is not tokenized); the message
            lists the columns found.
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
            if not hasattr(example, "keys"):
                raise ValueError(
                    f"example {i} of `train_dataset` is a {type(example).__name__}, not a dict of features with a "
                    f"{key!r} entry; tokenize the data first (e.g. `datasets.Dataset.map(tokenize)`)."
                )
            if key not in example:
                raise ValueError(
                    f"example {i} of `train_dataset` has no {key!r} (keys found: {sorted(example)}); tokenize it first."
                )
            lengths.append(len(example[key]))
    return np.maximum(np.asarray(lengths, dtype=np.int64), 1)


def has_token_column(dataset: Any, key: str = "input_ids") -> bool:
    """Whether `token_rows(dataset, key)` can read the examples: `key` is a column of a column-store dataset
    (`datasets.Dataset`), else a key of the first example; an empty dataset has none.

    Args:
        dataset (map-style dataset of `dict`): the examples.
        key (`str`, *optional*, defaults to `"input_ids"`): the token column.
    Returns:
        `bool`.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        return key in columns
    return len(dataset) > 0 and isinstance(dataset[0], Mapping) and key in dataset[0]


def token_rows(dataset: Any, key: str = "input_ids", batch_rows: int = 4096) -> list:
    """Token ids of every example, in order: a column-store dataset (`datasets.Dataset`) read `batch_rows` rows at a
    time in Arrow format (each row a numpy array; 100,000 rows of 100 tokens in about 0.3 s), any other map-style
    dataset example by example.

    Args:
        dataset (map-style dataset of `dict`): tokenized examples (the feature pass's view of the training data).
        key (`str`, *optional*, defaults to `"input_ids"`): the token column.
        batch_rows (`int`, *optional*, defaults to `4096`): rows per read of a column-store dataset.
    Returns:
        `list` of length `n_examples`: each example's token ids (a numpy array from a `datasets.Dataset`; otherwise
            a list, array or tensor, as the dataset holds them).
    Raises:
        KeyError: if an example has no `key`.
    """
    if key in (getattr(dataset, "column_names", None) or ()) and hasattr(dataset, "with_format"):
        table = dataset.with_format("arrow")
        rows: list = []
        for start in range(0, len(table), batch_rows):
            rows.extend(table[start: start + batch_rows][key].to_numpy(zero_copy_only=False))
        return rows
    return [dataset[i][key] for i in range(len(dataset))]


REPLY_MASK_KEYS = ("completion_mask", "assistant_masks")  # TRL's masks of the tokens that carry the loss


def has_replies(dataset: Any) -> bool:
    """Whether the examples say which of their tokens are the reply: `reply_rows(dataset)` is not `None`.

    Args:
        dataset (map-style dataset of `dict`): tokenized examples.
    Returns:
        `bool` (`False` for an empty dataset).
    """
    return reply_rows(dataset) is not None


def reply_rows(dataset: Any, batch_rows: int = 4096) -> list | None:
    """Each example's reply, the token ids that carry its loss, where the dataset says which: the entries of a
    token `labels` column other than `IGNORE_INDEX`, else the `input_ids` where TRL's `completion_mask` or
    `assistant_masks` column is 1. A reply is only *given* where some example's first two tokens carry no loss and
    a later one does (a masked prompt before its reply; a causal LM never scores position 0, so a masked first token
    alone is no prompt): rows whose every token carries the loss (plain text) have no reply apart from the whole row.

    Args:
        dataset (map-style dataset of `dict`): tokenized examples.
        batch_rows (`int`, *optional*, defaults to `4096`): rows per read of a column-store dataset.
    Returns:
        `list` of length `n_examples` of 1-D int arrays, or `None` when the examples have no such column, their
        `labels` are one class id each (a classification head) or no example masks a prompt before its reply.
    """
    if not len(dataset):
        return None
    if has_token_column(dataset, "labels"):
        if np.ndim(dataset[0]["labels"]) != 1:
            return None
        tokens = token_rows(dataset, "labels", batch_rows)
        masks = [np.asarray(values) != IGNORE_INDEX for values in tokens]
    else:
        key = next((k for k in REPLY_MASK_KEYS if has_token_column(dataset, k)), None)
        if key is None or not has_token_column(dataset):
            return None
        masks = [np.asarray(mask) == 1 for mask in token_rows(dataset, key, batch_rows)]
        tokens = token_rows(dataset, batch_rows=batch_rows)
    if not any(not mask[:2].any() and mask.any() for mask in masks):
        return None
    return [np.asarray(ids)[mask] for ids, mask in zip(tokens, masks)]


class LossTokensCollator:
    """Builds each example from its loss-bearing tokens alone before calling `collator`, for causal LMs.

    Example `i` becomes `input_ids = [bos] + c_i`, `labels = [-100] + c_i`, where `c_i` are the tokens of
    `input_ids` whose label is not -100 (in order; several assistant turns are joined). The prompt then takes no part
    in the forward pass, so two examples with the same loss-bearing tokens get the same features whatever their
    prompts. Without `bos_token_id`, the first loss-bearing token is the context of the rest and is not scored itself.
    Examples without `labels` (every token carries loss) or with no loss-bearing token pass through unchanged.

    Args:
        collator (`Callable[[list[dict]], dict]`): the trainer's data collator (pads `input_ids` and `labels`).
        bos_token_id (`int`, *optional*): token put before the loss-bearing tokens.
    """

    def __init__(self, collator: Callable[[list[dict]], dict], bos_token_id: int | None = None) -> None:
        self.collator = collator
        self.bos_token_id = bos_token_id

    def __call__(self, examples: list[dict]) -> dict:
        prefix = [] if self.bos_token_id is None else [int(self.bos_token_id)]
        rebuilt = []
        for example in examples:
            labels = example.get("labels")
            if labels is None or isinstance(labels, (int, np.integer)):
                rebuilt.append(example)
                continue
            labels = [int(x) for x in (labels.tolist() if hasattr(labels, "tolist") else labels)]
            ids = example["input_ids"]
            ids = [int(x) for x in (ids.tolist() if hasattr(ids, "tolist") else ids)]
            kept = [token for token, carries in zip(ids, loss_token_mask(labels, shift=False)) if carries]
            if not kept or len(labels) != len(ids):
                rebuilt.append(example)
                continue
            short = {"input_ids": prefix + kept, "labels": [IGNORE_INDEX] * len(prefix) + kept}
            if "attention_mask" in examples[0]:
                short["attention_mask"] = [1] * len(short["input_ids"])
            rebuilt.append(short)
        return self.collator(rebuilt)


def token_digest(dataset: Any, keys: tuple[str, ...] | None = None) -> str:
    """SHA-1 over every column of every example, in order (numbers as int64 / float64 bytes with each example's
    length first, anything else as its text): it changes when any token, label mask, attention mask or other input
    of the training data changes, also for data of the same lengths. One pass over each column.

    Args:
        dataset (map-style dataset of `dict`): tokenized examples (checked by `example_lengths` first).
        keys (`tuple[str, ...]`, *optional*): the columns hashed; `None` = all of them (sorted by name).
    Returns:
        `str`: hex digest.
    """
    import hashlib

    column_names = getattr(dataset, "column_names", None)
    if column_names is None:
        column_names = sorted(dataset[0]) if len(dataset) else []
    digest = hashlib.sha1()
    for key in sorted(column_names) if keys is None else keys:
        if key not in column_names:
            continue
        if hasattr(dataset, "with_format"):
            values = dataset.with_format(None)[key]
        else:
            values = (dataset[i][key] for i in range(len(dataset)))
        digest.update(key.encode())
        for value in values:
            array = np.asarray(value)
            if array.dtype.kind in "biu":
                array = array.astype(np.int64).reshape(-1)
            elif array.dtype.kind == "f":
                array = array.astype(np.float64).reshape(-1)
            else:
                array = np.frombuffer(repr(value).encode(), dtype=np.uint8)
            digest.update(np.int64(array.size).tobytes())
            digest.update(array.tobytes())
    return digest.hexdigest()
