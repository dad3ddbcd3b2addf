"""The target set of a trainer: where it comes from, its checks, and its feature view (layer L4).

`ClusterTrainer(target_dataset=...)` or `ClusterSelectConfig(target="eval")` (the trainer's `eval_dataset`; a dict
of eval datasets is one target task per key) aims the selection at a target set (`selection/targeted.py`).
`resolve_target` checks it before any model work and returns the `TargetSet` the feature pass reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._types import TargetSet
from ..config import ClusterSelectConfig, check_target_combination
from ..data import example_lengths, token_digest
from ..loss_tokens import IGNORE_INDEX
from ..persistence import data_fingerprint
from ..selection.budget import selection_budget
from ..selection.targeted import coverage_floor
from ..settings import TargetSettings

CHECK_BATCH = 64  # target rows collated at once by the format and loss checks


def resolve_target(config: ClusterSelectConfig, target_dataset: Any, eval_dataset: Any, *,
                   view: Callable[[Any], Any], collator: Callable[[list], Any], train_columns: list[str] | None,
                   shift_labels: bool, n_examples: int, prepare: Callable[[Any], Any] | None = None
                   ) -> TargetSet | None:
    """The run's `TargetSet`, checked; `None` for an untargeted run.

    Args:
        config (`ClusterSelectConfig`): `target` and the `TargetSettings` (`target_column`).
        target_dataset (map-style dataset, list of `dict`, or `None`): the trainer's `target_dataset`.
        eval_dataset (dataset, dict of datasets, or `None`): the trainer's `eval_dataset` (used for `target="eval"`).
        view (`Callable`): the trainer's feature view of a dataset (unused columns removed, as for training).
        collator (`Callable`): the training collator (the feature pass collates target rows with it).
        train_columns (`list[str]` or `None`): the training view's columns (`None` = not a columnar dataset).
        shift_labels (`bool`): whether labels are shifted (causal LM: `labels[0]` never carries loss).
        n_examples (`int`): training examples (the budget is `selection_budget(n_examples, data_fraction)`).
        prepare (`Callable`, *optional*): the trainer's data preparation, for raw rows (TRL's tokenization); it
            must keep every row.
    Returns:
        `TargetSet` or `None`.
    Raises:
        ValueError: before any model work: both `target_dataset` and `target="eval"`, `target="eval"` without an
            `eval_dataset`, target settings without a target, a combination `check_target_combination` refuses,
            an empty target, a `target_column` missing or with one value, a target whose columns or collated
            batches differ from the training data's, or a target task without a loss-bearing token.
    """
    if config.target == "eval" and target_dataset is not None:
        raise ValueError("give the target once: `target_dataset` or `ClusterSelectConfig(target='eval')`, not both.")
    if config.target == "eval" and eval_dataset is None:
        raise ValueError("`ClusterSelectConfig(target='eval')` needs the trainer's `eval_dataset`: pass one, or give "
                         "the target as `target_dataset`.")
    data, source = (eval_dataset, "eval_dataset") if config.target == "eval" else (target_dataset, "target_dataset")
    if data is None:
        if config.target_settings != TargetSettings():
            raise ValueError(f"`strategy_kwargs` sets targeted selection ({_target_settings(config)}) but the run "
                             "has no target: pass `target_dataset` or `ClusterSelectConfig(target='eval')`.")
        return None
    check_target_combination(config)
    if source == "target_dataset" and isinstance(data, Mapping):
        raise ValueError(f"`target_dataset` must be one dataset (name its tasks with the `target_column` setting), "
                         f"got a {type(data).__name__} with keys {sorted(map(str, data))}.")
    rows, task_of, names = _rows_and_tasks(data, config.target_settings.target_column, source)
    check_budget(config, n_examples, len(names))
    if prepare is not None:
        rows = prepare(rows)
        if len(rows) != task_of.size:
            raise ValueError(f"preparing `{source}` dropped {task_of.size - len(rows)} of its {task_of.size} rows "
                             "(TRL drops rows whose loss-bearing tokens truncation to `max_length` removed): raise "
                             "`max_length` or shorten the target's prompts.")
    _check_format(rows, train_columns, source)
    rows = view(rows)
    lengths = example_lengths(rows)
    _check_loss_tokens(rows, collator, task_of, names, source, shift_labels)
    return TargetSet(dataset=rows, lengths=tuple(int(n) for n in lengths), tasks=task_of, task_names=tuple(names),
                     source=source, fingerprint=data_fingerprint(lengths, token_digest(rows)))


def check_budget(config: ClusterSelectConfig, n_examples: int, n_tasks: int) -> None:
    """Refuse more target tasks than the target share of the budget (some tasks would get nothing)."""
    budget = selection_budget(n_examples, config.data_fraction)
    share = budget - coverage_floor(budget, config.target_settings.target_coverage)
    if share < n_tasks:
        raise ValueError(f"{n_tasks} target tasks but the target share of the budget is {share} examples "
                         f"(data_fraction={config.data_fraction} of {n_examples}, target_coverage="
                         f"{config.target_settings.target_coverage}): some tasks would get nothing. Raise "
                         "data_fraction, lower target_coverage, or merge target tasks.")


def _target_settings(config: ClusterSelectConfig) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in (config.strategy_kwargs or {}).items() if k in TargetSettings.__dataclass_fields__)


def _rows_and_tasks(data: Any, column: str | None, source: str) -> tuple[Any, np.ndarray, list[str]]:
    """One dataset of all target rows, the task of every row `[n_target]` and the task names.

    A dict of datasets (several eval sets) is concatenated, one task per key unless `column` is given."""
    import datasets

    if isinstance(data, Mapping):
        parts = {str(k): _as_dataset(v, f"{source}[{k!r}]") for k, v in data.items()}
        if not parts:
            raise ValueError(f"`{source}` is an empty dict: the target needs at least one example.")
        empty = [k for k, part in parts.items() if len(part) == 0]
        if empty:
            raise ValueError(f"`{source}[{empty[0]!r}]` is empty: every eval set used as a target task needs rows.")
        rows = datasets.concatenate_datasets(list(parts.values()))
        keys = np.repeat(np.arange(len(parts)), [len(p) for p in parts.values()])
        by_key = (keys, list(parts)) if column is None else None
    else:
        rows, by_key = _as_dataset(data, source), None
    if len(rows) == 0:
        raise ValueError(f"`{source}` is empty: the target needs at least one example of what will be evaluated.")
    if by_key is not None:
        return rows, by_key[0].astype(np.int64), by_key[1]
    if column is None:
        return rows, np.zeros(len(rows), dtype=np.int64), ["target"]
    if column not in rows.column_names:
        raise ValueError(f"`target_column` {column!r} is not a column of `{source}` (columns: "
                         f"{sorted(rows.column_names)}).")
    raw = rows.with_format(None)[column]
    missing = sum(value is None for value in raw)
    if missing:
        raise ValueError(f"`target_column` {column!r} has no value in {missing} of the {len(raw)} rows of `{source}`: "
                         "name the task of every target row.")
    names, task_of = np.unique([str(v) for v in raw], return_inverse=True)
    if names.size < 2:
        raise ValueError(f"`target_column` {column!r} has one value ({str(names[0])!r}) in `{source}`: one target "
                         "task needs no column; drop `target_column`, or give rows of several tasks.")
    return rows, task_of.reshape(-1).astype(np.int64), [str(n) for n in names]


def _as_dataset(data: Any, name: str):
    """`data` as a `datasets.Dataset` (a list of dicts or a map-style dataset of dicts is converted)."""
    import datasets

    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, (datasets.DatasetDict, datasets.IterableDataset)) or not hasattr(data, "__len__"):
        raise ValueError(f"`{name}` must be a datasets.Dataset or a list of dicts (map-style, with a length), got "
                         f"{type(data).__name__}.")
    rows = [data[i] for i in range(len(data))]
    if not all(isinstance(row, Mapping) for row in rows):
        raise ValueError(f"`{name}` must hold dicts (one example each, as the training data), got "
                         f"{type(rows[0]).__name__ if rows else 'nothing'}.")
    return datasets.Dataset.from_list([dict(row) for row in rows])


def _check_format(rows: Any, train_columns: list[str] | None, source: str) -> None:
    """Refuse a target without the columns the training view has (another format than the training data)."""
    if train_columns is None:
        return
    missing = sorted(set(train_columns) - set(rows.column_names))
    if missing:
        raise ValueError(f"`{source}` is not in the training data's format: it lacks the column(s) {missing} that "
                         f"`train_dataset` has (target columns: {sorted(rows.column_names)}). Tokenize and label it "
                         "as the training data.")


def _check_loss_tokens(rows: Any, collator: Callable, task_of: np.ndarray, names: list[str], source: str,
                       shift_labels: bool) -> None:
    """Collate every target row as training would; refuse a failing collator or a task whose collated `labels`
    carry no loss-bearing token (skipped when the batches have no `labels`)."""
    carries = np.zeros(len(rows), dtype=bool)
    for start in range(0, len(rows), CHECK_BATCH):
        chunk = [rows[i] for i in range(start, min(start + CHECK_BATCH, len(rows)))]
        try:
            batch = collator(chunk)
        except Exception as error:
            raise ValueError(f"the training data collator failed on `{source}` (columns: {sorted(rows.column_names)})"
                             f": {type(error).__name__}: {error}. Give the target in the training data's format.") \
                from error
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        if labels is None:
            return
        labels = np.asarray(labels.cpu() if hasattr(labels, "cpu") else labels)
        if labels.ndim == 2:
            carries[start:start + len(chunk)] = (labels[:, 1 if shift_labels else 0:] != IGNORE_INDEX).any(axis=1)
        else:
            carries[start:start + len(chunk)] = labels.reshape(-1) != IGNORE_INDEX
    empty = [name for task, name in enumerate(names) if not carries[task_of == task].any()]
    if empty:
        raise ValueError(f"`{source}`: target task(s) {empty} have no loss-bearing token (every label "
                         f"{IGNORE_INDEX}): the target must show what the model should produce.")
