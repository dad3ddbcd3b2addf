"""What `ClusterSFTTrainer` adds to `trl.SFTTrainer`: dataset and settings checks, and per-example loss weights on
TRL's fused loss path (layer L4: reads TRL's `SFTConfig` fields, never a `Trainer`).

TRL accepts three dataset formats (plus already tokenized data): language modelling (`text`, or the column named by
`dataset_text_field`), prompt-completion (`prompt` and `completion`, strings or message lists) and conversational
(`messages`, or ShareGPT-style `conversations`). It tokenizes them in `SFTTrainer.__init__`, builds `labels` with
-100 on tokens without loss (`completion_only_loss`, `assistant_only_loss`), truncates to `max_length`, and silently
drops examples that truncation left without any loss-bearing token. The checks here run before that, so a wrong
dataset fails before any model is loaded or any example tokenized; `loss_free_examples` counts what preparation
left behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..loss_tokens import IGNORE_INDEX, has_loss_token
from ..validation import check_train_dataset

FORMATS = ("tokenized", "formatting_func", "conversational", "prompt_completion", "text")
DEFAULT_MAX_DROPPED_FRACTION = 0.25


def _columns(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    if names is None and hasattr(dataset, "features") and dataset.features is not None:
        names = list(dataset.features)
    return None if names is None else list(names)


def check_sft_dataset(
    dataset: Any, *, dataset_text_field: str = "text", formatting_func: Any = None, name: str = "train_dataset"
) -> str:
    """Check a dataset given to `ClusterSFTTrainer` and name its format, before TRL prepares it.

    Args:
        dataset (`datasets.Dataset`): the raw training split (one split, map-style).
        dataset_text_field (`str`, *optional*, defaults to `"text"`): `SFTConfig.dataset_text_field`.
        formatting_func (`Callable`, *optional*): the trainer's `formatting_func`; it builds the text itself.
        name (`str`, *optional*, defaults to `"train_dataset"`): how error messages call the dataset.
    Returns:
        `str`: one of `FORMATS` — `"tokenized"` (has `input_ids`), `"formatting_func"`, `"conversational"`
        (`messages`/`conversations`), `"prompt_completion"`, `"text"`.
    Raises:
        ValueError: for a `DatasetDict` or dict of splits (naming the splits), a streaming or length-less dataset, an
            empty dataset, or columns that match no format (naming the columns found and the formats accepted).
    """
    check_train_dataset(dataset, name)
    columns = _columns(dataset)
    if columns is None:
        first = dataset[0]
        columns = list(first) if isinstance(first, Mapping) else []
    if "input_ids" in columns:
        return "tokenized"
    if formatting_func is not None:
        return "formatting_func"
    if "messages" in columns or "conversations" in columns:
        return "conversational"
    if "prompt" in columns or "completion" in columns:
        missing = [c for c in ("prompt", "completion") if c not in columns]
        if missing:
            raise ValueError(
                f"`{name}` looks like prompt-completion data but has no {missing[0]!r} column (columns found: "
                f"{sorted(columns)}); a prompt-completion dataset needs both 'prompt' and 'completion'."
            )
        return "prompt_completion"
    if dataset_text_field in columns:
        return "text"
    raise ValueError(
        f"`{name}` matches no SFT dataset format (columns found: {sorted(columns)}). Give one of: "
        f"{dataset_text_field!r} (language modelling; the column is `SFTConfig.dataset_text_field`), 'prompt' + "
        "'completion', 'messages' (chat), or tokenized 'input_ids' (+ optional 'labels'); or pass `formatting_func`."
    )


def check_sft_args(args: Any, *, compute_loss_func: Any = None) -> None:
    """Reject `SFTConfig` settings under which selection would be silently wrong.

    Args:
        args (`SFTConfig` or `TrainingArguments`): the trainer's arguments (fields TRL lacks count as off).
        compute_loss_func (`Callable`, *optional*): the trainer's deprecated `compute_loss_func`.
    Raises:
        ValueError: for `packing=True` or `padding_free=True` (several examples share one row, so per-example
            features and weights cannot be told apart), `loss_type` other than `"nll"`, `label_smoothing_factor > 0`,
            or a `compute_loss_func` (per-example loss weights need the per-token negative log-likelihood).
    """
    if getattr(args, "packing", False):
        raise ValueError(
            "ClusterSFTTrainer does not support `packing=True`: packing concatenates several examples into one row, "
            "so the per-example features, the selection and the per-example loss weights would apply to packed rows, "
            "not to your examples. Set `packing=False` (selection already removes much of the work packing saves; "
            "with several ranks, token-balanced batches keep padding low), or train with plain `SFTTrainer` if you "
            "need packing."
        )
    if getattr(args, "padding_free", False):
        raise ValueError(
            "ClusterSFTTrainer does not support `padding_free=True`: it flattens a batch into one row, so per-example "
            "loss weights cannot be applied. Set `padding_free=False`."
        )
    loss_type = getattr(args, "loss_type", "nll")
    if loss_type != "nll":
        raise ValueError(
            f"ClusterSFTTrainer supports `loss_type='nll'` only, got {loss_type!r}: the per-example loss weights that "
            "keep the selected subset representative multiply the per-token negative log-likelihood."
        )
    if getattr(args, "label_smoothing_factor", 0.0) > 0:
        raise ValueError(
            f"ClusterSFTTrainer does not support `label_smoothing_factor={args.label_smoothing_factor}` (deprecated in "
            "TRL): the selected examples' loss weights could not be applied. Set it to 0."
        )
    if compute_loss_func is not None:
        raise ValueError(
            "ClusterSFTTrainer does not support `compute_loss_func` (deprecated in TRL): the selected examples' loss "
            "weights could not be applied. Subclass ClusterSFTTrainer and override `compute_loss` instead."
        )


def loss_free_examples(dataset: Any, labels_key: str = "labels", batch_size: int = 10_000) -> np.ndarray:
    """Indices of tokenized examples without any loss-bearing token.

    For a causal LM, position `t` predicts `labels[t]` from the tokens before it, so `labels[0]` never carries loss;
    an example carries loss when some `labels[t] != -100` with `t >= 1`.

    Args:
        dataset (map-style dataset of `dict`): prepared examples.
        labels_key (`str`, *optional*, defaults to `"labels"`): the labels column.
        batch_size (`int`, *optional*, defaults to `10000`): rows read at once (Arrow batches; memory stays bounded).
    Returns:
        `np.ndarray` of shape `[n_without_loss]`, int64, sorted; empty when the dataset has no labels column (every
        token then carries loss).
    """
    columns = _columns(dataset)
    if columns is not None and labels_key not in columns:
        return np.zeros(0, dtype=np.int64)
    if not hasattr(dataset, "with_format") or columns is None:
        values = [dataset[i].get(labels_key) for i in range(len(dataset))]
        return np.asarray([i for i, labels in enumerate(values) if not has_loss_token(labels, shift=True)],
                          dtype=np.int64)
    import pyarrow.compute as pc

    empty, offset = [], 0
    for table in dataset.select_columns([labels_key]).with_format("arrow").iter(batch_size=batch_size):
        labels = table.column(labels_key).combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(labels), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.fill_null(labels.flatten(), IGNORE_INDEX).to_numpy(zero_copy_only=False)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        carries = (values != IGNORE_INDEX) & (np.arange(values.size) - starts >= 1)  # labels[0] never carries loss
        has_loss = np.zeros(len(lengths), dtype=bool)
        has_loss[np.repeat(np.arange(len(lengths)), lengths)[carries]] = True
        empty.append(np.flatnonzero(~has_loss) + offset)
        offset += len(lengths)
    return np.concatenate(empty).astype(np.int64) if empty else np.zeros(0, dtype=np.int64)


def check_dropped(n_given: int, n_dropped: int, max_dropped_fraction: float, *, max_length: int | None) -> None:
    """Fail when data preparation left too few examples with a loss-bearing token.

    Args:
        n_given (`int`): examples passed to the trainer.
        n_dropped (`int`): examples removed because no token carried loss (TRL's truncation filter, plus any left).
        max_dropped_fraction (`float`, in [0, 1]): the share of `n_given` that may be dropped.
        max_length (`int`, *optional*): `SFTConfig.max_length`, quoted in the message.
    Raises:
        ValueError: if every example was dropped, or `n_dropped / n_given > max_dropped_fraction`.
    """
    if n_dropped == 0:
        return
    advice = (
        f"Raise `max_length` (now {max_length}), shorten the prompts (TRL 1.16 deprecates "
        "`truncation_mode='keep_end'`, which kept the answer end), or check "
        "the loss masks (`completion_only_loss`, `assistant_only_loss`)."
    )
    if n_dropped >= n_given:
        raise ValueError(f"all {n_given} training examples were left without a loss-bearing token. {advice}")
    if n_dropped / n_given > max_dropped_fraction:
        raise ValueError(
            f"{n_dropped} of {n_given} training examples ({100 * n_dropped / n_given:.1f}%) were left without a "
            f"loss-bearing token after truncation and would be dropped, above `max_dropped_fraction="
            f"{max_dropped_fraction}`. {advice} To train on the rest anyway, pass a higher `ClusterSFTTrainer(..., max_dropped_fraction=...)`."
        )


def tokenizer_adds_eos(tokenizer: Any) -> bool:
    """Whether `tokenizer("...")` already ends with the EOS token (a post-processor that appends it).

    TRL appends the EOS *text* to `text` and `completion` strings before tokenizing, so such a tokenizer yields a
    doubled EOS that the model learns to emit.

    Args:
        tokenizer (`PreTrainedTokenizerBase` or `ProcessorMixin`): the trainer's `processing_class`.
    Returns:
        `bool`; `False` when it cannot tell (no EOS token, or not a text tokenizer).
    """
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None or not callable(tokenizer):
        return False
    try:
        ids = tokenizer("a")["input_ids"]
    except Exception:  # noqa: BLE001 - a check that must never break construction
        return False
    return bool(ids) and ids[-1] == eos


class ExampleWeightedForward:
    """Calls `model` and multiplies the per-token log-probabilities of TRL's fused LM head by each example's weight,
    so that `SFTTrainer.compute_loss` (`loss = -Σ log_probs / num_tokens`) computes the weighted loss
    `Σ_i w_i Σ_t CE_it / num_tokens` and still logs its entropy and token-accuracy metrics unchanged.

    Args:
        model (`torch.nn.Module`): the (possibly wrapped) model `SFTTrainer.compute_loss` receives.
        weights (`torch.Tensor` of shape `[batch]`): per-example loss weights (finite, >= 0).
    Raises:
        ValueError: on call, if the fused output's rows do not match `weights`.
    """

    def __init__(self, model: torch.nn.Module, weights: torch.Tensor) -> None:
        self.model = model
        self.weights = weights

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self.model(*args, **kwargs)
        log_probs = getattr(outputs, "log_probs", None) if kwargs.get("fused_lm_head") else None
        if log_probs is None:
            return outputs
        if log_probs.shape[0] != self.weights.shape[0]:
            raise ValueError(
                f"per-example weights of shape {tuple(self.weights.shape)} do not match the fused log-probabilities of "
                f"shape {tuple(log_probs.shape)}."
            )
        weights = self.weights.to(log_probs.device, log_probs.dtype).reshape(-1, *([1] * (log_probs.dim() - 1)))
        outputs.log_probs = log_probs * weights
        return outputs

