"""Per-example weighted training losses (layer L2: tensors in, tensor out; no Trainer import).

Selection keeps `kept_c` of the `|C_c|` examples of cluster `c` and gives each kept example the weight
`|C_c| / kept_c`, rescaled to mean 1 over the kept set (`Selection.loss_weights`). Multiplying each example's loss
by its weight makes the loss of the kept set an unbiased estimate of the full-data loss, while the loss keeps the
scale the learning rate was tuned for. With every weight equal to 1 these functions return exactly the loss that
transformers' `Trainer` computes (token mean for language models, example mean for classification).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .loss_tokens import IGNORE_INDEX


def weighted_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    example_weights: torch.Tensor,
    *,
    shift: bool,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross-entropy over tokens, each token weighted by its example's weight.

    `loss = Σ_i w_i Σ_t CE_it / D` with `D = num_items_in_batch` when given (the loss-bearing tokens of the whole
    accumulated batch, as transformers computes it) and otherwise the loss-bearing tokens of this batch.

    Args:
        logits (`torch.Tensor` of shape `[batch, seq_len, vocab]`): model outputs.
        labels (`torch.Tensor` of shape `[batch, seq_len]`): target ids, `ignore_index` where no loss.
        example_weights (`torch.Tensor` of shape `[batch]`): weight of each example (finite, >= 0).
        shift (`bool`): whether position `t` predicts label `t + 1` (causal language models).
        num_items_in_batch (`torch.Tensor` or `int`, *optional*): the loss denominator, in tokens.
        ignore_index (`int`, *optional*, defaults to `-100`): label of positions without loss.
    Returns:
        `torch.Tensor`: scalar loss (float32).
    Raises:
        ValueError: if the shapes do not match.
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"`logits` must be [batch, seq_len, vocab] and `labels` [batch, seq_len], got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}."
        )
    if example_weights.shape != (labels.shape[0],):
        raise ValueError(f"`example_weights` must have shape [{labels.shape[0]}], got {tuple(example_weights.shape)}.")
    labels = labels.to(logits.device)
    if shift:  # shift the labels, not the logits: no copy of a [batch, seq_len - 1, vocab] slice (as transformers)
        labels = F.pad(labels[:, 1:], (0, 1), value=ignore_index)
    per_token = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index, reduction="none"
    ).view(labels.shape)
    weighted = (per_token * example_weights.to(per_token.device, torch.float32)[:, None]).sum()
    if num_items_in_batch is None:
        denominator = (labels != ignore_index).sum()
    else:
        denominator = num_items_in_batch
    if isinstance(denominator, torch.Tensor):
        denominator = denominator.to(weighted.device)
    return weighted / denominator


def weighted_example_loss(
    logits: torch.Tensor, labels: torch.Tensor, example_weights: torch.Tensor, *, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Weighted mean over examples of sequence-classification cross-entropy: `Σ_i w_i CE_i / n_labelled`.

    Args:
        logits (`torch.Tensor` of shape `[batch, num_labels]`): classifier outputs.
        labels (`torch.Tensor` of shape `[batch]`): class ids.
        example_weights (`torch.Tensor` of shape `[batch]`): weight of each example.
        ignore_index (`int`, *optional*, defaults to `-100`): label of examples without loss.
    Returns:
        `torch.Tensor`: scalar loss (float32).
    Raises:
        ValueError: if the shapes do not match.
    """
    if logits.dim() != 2 or labels.shape != (logits.shape[0],) or example_weights.shape != labels.shape:
        raise ValueError(
            f"`logits` must be [batch, num_labels] with `labels` and `example_weights` [batch], got "
            f"{tuple(logits.shape)}, {tuple(labels.shape)}, {tuple(example_weights.shape)}."
        )
    labels = labels.to(logits.device)
    per_example = F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="none")
    weights = example_weights.to(per_example.device, torch.float32)
    return (per_example * weights).sum() / (labels != ignore_index).sum().clamp(min=1)


def weighted_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    example_weights: torch.Tensor,
    *,
    causal: bool,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """Dispatch to `weighted_token_loss` (logits `[batch, seq_len, vocab]`, labels `[batch, seq_len]`; shifted when
    `causal`) or `weighted_example_loss` (logits `[batch, num_labels]`, integer labels `[batch]`).

    Raises:
        ValueError: for any other head (regression, multi-label), naming the shapes received.
    """
    if logits.dim() == 3 and labels.dim() == 2:
        return weighted_token_loss(logits, labels, example_weights, shift=causal, num_items_in_batch=num_items_in_batch)
    if logits.dim() == 2 and labels.dim() == 1 and not labels.is_floating_point():
        return weighted_example_loss(logits, labels, example_weights)
    raise ValueError(
        "per-example loss weights support token-level language modelling and single-label classification; got "
        f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)}. Use data_fraction=1.0 or a supported head."
    )
