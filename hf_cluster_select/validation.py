"""Checks of a ClusterTrainer run's inputs before any model work (layer L2: plain values in, clear errors out).

`SelectionRun`'s adapter (`integrations.trainer.ClusterSelectMixin.plan`) calls `check_training_inputs` after validating the dataset's length and columns and
before the first forward pass, so that a bad setup fails in seconds, not after a warm-up. Every error names the
argument at fault, what was expected and how to fix it (README, "Troubleshooting").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from ._imports import require_hdbscan
from .config import ClusterSelectConfig
from .loss_tokens import IGNORE_INDEX, has_loss_token

logger = logging.getLogger(__name__)

PROBE_EXAMPLES = 8


def check_map_style(dataset: Any, name: str = "train_dataset") -> None:
    """Refuse what selection cannot use: a dict of splits, or a dataset without `__len__` (streaming).

    Called from `ClusterTrainer.__init__` too, before `Trainer` asks a streaming dataset for `max_steps` (setting it
    would only lead to this error). `None` passes (a dataset may be set later).

    Args:
        dataset (`Any`): the training data.
        name (`str`, *optional*, defaults to `"train_dataset"`): how error messages call it.
    Raises:
        ValueError: naming the type received and what to pass instead.
    """
    if dataset is None:
        return
    if isinstance(dataset, Mapping) or (hasattr(dataset, "keys") and hasattr(dataset, "values")
                                        and not hasattr(dataset, "column_names")):
        splits = sorted(str(key) for key in dataset.keys())
        if not splits:
            raise ValueError(f"`{name}` is an empty dict of splits; pass one `datasets.Dataset`.")
        raise ValueError(f"`{name}` is a dict of splits ({splits}); pass one split, e.g. "
                         f"dataset[{('train' if 'train' in splits else splits[0])!r}].")
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            f"`{name}` must be a map-style dataset with `__len__` (selection needs to see every example), "
            f"got {type(dataset).__name__}; materialise a streaming dataset first (e.g. `Dataset.from_generator`)."
        )


def check_train_dataset(dataset: Any, name: str = "train_dataset") -> int:
    """The number of training examples, after `check_map_style`.

    Raises:
        ValueError: if `dataset` is `None`, not map-style (see `check_map_style`) or empty.
    """
    if dataset is None:
        raise ValueError(f"ClusterTrainer needs a `{name}`.")
    check_map_style(dataset, name)
    n = len(dataset)
    if n == 0:
        raise ValueError(f"`{name}` is empty.")
    return n


def check_dependencies(config: ClusterSelectConfig) -> None:
    """Import the optional packages `config` needs now, not after the warm-up.

    Raises:
        ImportError: if `config.cluster_method == "hdbscan"` and `hdbscan` cannot be imported; the message says how
            to fix it and names the fallback `cluster_method="kmeans"`.
    """
    if config.cluster_method == "hdbscan":
        require_hdbscan()


def _columns(dataset: Any) -> list[str]:
    names = getattr(dataset, "column_names", None)
    if names is None and len(dataset):
        first = dataset[0]
        names = list(first.keys()) if isinstance(first, Mapping) else [f"<{type(first).__name__}>"]
    return sorted(names or [])


def probe_collator(
    dataset: Any,
    collator: Callable[[list[Any]], Any],
    *,
    label_names: Sequence[str] = ("labels",),
    needs_labels: bool = True,
    n_probe: int = PROBE_EXAMPLES,
) -> Mapping[str, Any]:
    """Collate the first `n_probe` examples as training will, to catch missing columns before any model work.

    Args:
        dataset (map-style dataset of `dict`): the training view (after Trainer removed unused columns).
        collator (`Callable`): the trainer's data collator.
        label_names (`Sequence[str]`, *optional*): batch keys the model's loss needs (`Trainer.label_names`).
        needs_labels (`bool`, *optional*, defaults to `True`): whether a batch without any of `label_names` is an
            error (False when the model returns a loss by itself or a `compute_loss_func` is given).
        n_probe (`int`, *optional*, defaults to `8`): examples to collate (fewer if the dataset is smaller).
    Returns:
        `Mapping`: the collated batch.
    Raises:
        ValueError: if the collator fails, returns something other than a mapping, or (with `needs_labels`)
            returns none of `label_names`; the message lists the columns found.
    """
    count = min(len(dataset), n_probe)
    user_collator = getattr(collator, "data_collator", collator)  # under Trainer's RemoveColumnsCollator
    name = getattr(user_collator, "__name__", type(user_collator).__name__)
    try:
        batch = collator([dataset[i] for i in range(count)])
    except Exception as error:
        raise ValueError(
            f"the data collator ({name}) failed on the first {count} examples of `train_dataset` "
            f"(columns found: {_columns(dataset)}): {type(error).__name__}: {error}. Make sure the dataset is "
            "tokenized and has the columns this collator needs (e.g. `input_ids`)."
        ) from error
    if not isinstance(batch, Mapping):
        raise ValueError(f"the data collator ({name}) must return a dict of tensors, got {type(batch).__name__}.")
    if needs_labels and not any(key in batch for key in label_names):
        raise ValueError(
            f"the data collator's batches have none of {list(label_names)} (batch keys: {sorted(batch)}), so the "
            "model cannot compute a training loss. Add a `labels` column to `train_dataset`, or use a collator that "
            "makes labels (e.g. `DataCollatorForLanguageModeling(tokenizer, mlm=False)` for a causal LM)."
        )
    return batch


def count_no_loss_examples(dataset: Any, batch: Mapping[str, Any] | None = None, *, shift: bool = True) -> int | None:
    """Examples whose `labels` column carries no loss-bearing token (every label -100).

    Trusted only when the collated probe `batch` (from `probe_collator`, the first examples in order) agrees with
    the column about which probe examples carry a loss; a collator that makes its own labels disagrees, and the
    count is then left to feature extraction (`FeatureOutput.loss_tokens`).

    Args:
        dataset (map-style dataset of `dict`): the training view.
        batch (`Mapping`, *optional*): the collated probe batch.
        shift (`bool`, *optional*, defaults to `True`): causal LM — the first label of an example is never scored.
    Returns:
        `int` or `None`: the count, or `None` when the dataset has no `labels` column or the column is not what
        training will use.
    """
    names = getattr(dataset, "column_names", None)
    if names is not None:
        if "labels" not in names:
            return None
        column = dataset.with_format(None)["labels"] if hasattr(dataset, "with_format") else dataset["labels"]
    else:
        examples = [dataset[i] for i in range(len(dataset))]
        if not all(isinstance(e, Mapping) and "labels" in e for e in examples):
            return None
        column = [e["labels"] for e in examples]
    has_loss = np.array([has_loss_token(labels, shift=shift) for labels in column], dtype=bool)
    collated = None if batch is None else batch.get("labels")
    if collated is not None:
        collated = np.asarray(collated.cpu() if hasattr(collated, "cpu") else collated)
        if collated.ndim == 2:
            probe = (collated[:, 1 if shift else 0 :] != IGNORE_INDEX).any(axis=1)
        else:
            probe = collated.reshape(-1) != IGNORE_INDEX
        if probe.shape[0] > has_loss.shape[0] or not np.array_equal(probe, has_loss[: probe.shape[0]]):
            return None
    return int((~has_loss).sum())


def check_training_inputs(
    dataset: Any,
    collator: Callable[[list[Any]], Any],
    config: ClusterSelectConfig,
    *,
    label_names: Sequence[str] = ("labels",),
    needs_labels: bool = True,
    shift_labels: bool = True,
) -> int | None:
    """Every check `plan()` makes after the step plan: dependencies, a collated probe batch, loss-bearing labels.

    Examples without any loss-bearing token are allowed (training on them changes nothing): they are counted here
    when the `labels` column tells (logged as a warning), kept out of clustering and selected only when the budget
    needs them (`clustering.cluster_features`, `selection.select_from_labels`).

    Args:
        dataset (map-style dataset of `dict`), collator (`Callable`): the training view and collator.
        config (`ClusterSelectConfig`): the selection settings.
        label_names, needs_labels: see `probe_collator`. shift_labels: see `count_no_loss_examples`.
    Returns:
        `int` or `None`: examples without loss-bearing tokens, when the `labels` column tells.
    Raises:
        ImportError: see `check_dependencies`.
        ValueError: see `probe_collator`; or if no example has a loss-bearing token.
    """
    check_dependencies(config)
    batch = probe_collator(dataset, collator, label_names=label_names, needs_labels=needs_labels)
    count = count_no_loss_examples(dataset, batch, shift=shift_labels)
    if count is not None and count == len(dataset):
        raise ValueError(
            f"none of the {count} examples of `train_dataset` has a loss-bearing token (every `labels` entry is "
            f"{IGNORE_INDEX}{' after the first' if shift_labels else ''}): there is nothing to train on. Check the "
            "label masking (completion-only loss, `max_length` truncation cutting off every answer)."
        )
    if count:
        logger.warning(
            "%d of %d examples of `train_dataset` have no loss-bearing token (labels all %d); they are kept out of "
            "clustering and selected only if the budget needs them.", count, len(dataset), IGNORE_INDEX,
        )
    return count


def check_loss_tokens(loss_tokens: Any) -> int:
    """After feature extraction: the number of examples without loss-bearing tokens.

    Args:
        loss_tokens (array-like of shape `[n_examples]`, int): `FeatureOutput.loss_tokens`, gathered over ranks.
    Returns:
        `int`: examples with 0 loss-bearing tokens.
    Raises:
        ValueError: if every example has 0 (nothing to select or train on).
    """
    tokens = np.asarray(loss_tokens).reshape(-1)
    count = int((tokens == 0).sum())
    if count == tokens.size:
        raise ValueError(
            f"none of the {count} examples of `train_dataset` has a loss-bearing token after collation (every "
            f"label is {IGNORE_INDEX}): there is nothing to select or train on. Check the label masking "
            "(completion-only loss, `max_length` truncation cutting off every answer)."
        )
    return count


def check_loss_path(*, loss_weighted: bool, label_smoothing_factor: float, has_compute_loss_func: bool,
                    shift_labels: bool, model_config: Any, model_name: str) -> None:
    """Refuse, before any model work, settings under which the per-example loss weights would be dropped or the
    features undefined. The weighted loss has no fallback at run time: what is not refused here is applied.

    Args:
        loss_weighted (`bool`): `RunFacts.loss_weighted` (weights other than 1 can occur).
        label_smoothing_factor (`float`): `TrainingArguments.label_smoothing_factor`.
        has_compute_loss_func (`bool`): whether the trainer was given a `compute_loss_func`.
        shift_labels (`bool`): `RunFacts.shift_labels` (a token-level language model).
        model_config (*optional*): the model's config (`problem_type`, `num_labels`).
        model_name (`str`): the model's class name, for the message.
    Raises:
        ValueError: for label smoothing or a `compute_loss_func` while the loss is weighted (also at
            `data_fraction=1.0` with an allocation that re-weights the full data, CluSTER's), or a regression or
            multi-label head.
    """
    if loss_weighted and label_smoothing_factor:
        raise ValueError(
            f"`label_smoothing_factor={label_smoothing_factor}` is not supported with selection: the label smoother "
            "computes its own loss, so the selected examples' loss weights (or the 'paper' allocation's per-rank "
            "weights) would be ignored. Set it to 0, or use data_fraction=1.0 with allocation='balanced'.")
    if loss_weighted and has_compute_loss_func:
        raise ValueError(
            "`compute_loss_func` is not supported with selection: the selected examples' loss weights (or the "
            "'paper' allocation's per-rank weights) could not be applied. Subclass ClusterTrainer and override "
            "`compute_loss` instead (call `super().compute_loss`).")
    problem = getattr(model_config, "problem_type", None)
    single_output = problem is None and getattr(model_config, "num_labels", 2) == 1  # transformers: regression
    if not shift_labels and (problem in ("regression", "multi_label_classification") or single_output):
        raise ValueError(
            f"{model_name} is a regression or multi-label head (num_labels={getattr(model_config, 'num_labels', None)}"
            f", problem_type={problem!r}); selection supports token-level language modelling and single-label "
            "classification (class-id labels).")


def check_feature_context(config: ClusterSelectConfig, *, shift_labels: bool, model_name: str) -> None:
    """Refuse `feature_context="loss_tokens"` for a model that is not a causal language model.

    Raises:
        ValueError: naming the setting and the model class.
    """
    if config.feature_settings.feature_context == "loss_tokens" and not shift_labels:
        raise ValueError(
            "`feature_context='loss_tokens'` applies to causal language models (labels aligned with `input_ids`); "
            f"{model_name} is not one. Use `feature_context='full'`.")
