"""Per-example weighted training losses (layer L2: tensors in, tensor out; no Trainer import).

Selection keeps `kept_c` of the `|C_c|` examples of cluster `c` and gives each kept example the weight
`|C_c| / kept_c`, rescaled to mean 1 over the kept set (`Selection.loss_weights`). Multiplying each example's loss
by its weight makes the loss of the kept set an unbiased estimate of the full-data loss, while the loss keeps the
scale the learning rate was tuned for. With every weight equal to 1 these functions return exactly the loss that
transformers' `Trainer` computes (token mean for language models, example mean for classification).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def weighted_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    example_weights: torch.Tensor,
    *,
    shift: bool,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
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
    if shift:
        logits = logits[:, :-1, :]
        labels = labels[:, 1:]
    labels = labels.to(logits.device)
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
    logits: torch.Tensor, labels: torch.Tensor, example_weights: torch.Tensor, *, ignore_index: int = -100
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


def cluster_rank_weights(kept_labels: Any, labels: Any, n_ranks: int) -> np.ndarray:
    """CluSTER's per-rank loss weight (Kim et al., EMNLP 2026) as a weight per kept example: `K·|C_k|/N`.

    With one cluster per rank, rank `k` sees only cluster `k`; data-parallel training averages the ranks' gradients
    with equal weight `1/K`, so multiplying rank `k`'s loss by `K·|C_k|/N` restores each cluster's full-data share
    `|C_k|/N` in the update. Every example of cluster `k` gets that weight, so a per-example weighted loss applies
    exactly the per-rank factor.

    Args:
        kept_labels (`np.ndarray` of shape `[n_kept]`, int): cluster of each kept example.
        labels (`np.ndarray` of shape `[n_examples]`, int): cluster of every example of the full data (`|C_k|`, `N`).
        n_ranks (`int`): number of clusters = ranks `K` (>= 1).
    Returns:
        `np.ndarray` of shape `[n_kept]`, float64.
    Raises:
        ValueError: if `n_ranks` < 1, `labels` is empty, or a kept label does not occur in `labels`.
    """
    labels, kept_labels = np.asarray(labels).reshape(-1), np.asarray(kept_labels).reshape(-1)
    if n_ranks < 1 or labels.size == 0:
        raise ValueError(f"`n_ranks` must be >= 1 and `labels` non-empty, got {n_ranks} and {labels.size} labels.")
    clusters, sizes = np.unique(labels, return_counts=True)
    position = np.searchsorted(clusters, kept_labels)
    if kept_labels.size and (position.max() >= clusters.size or np.any(clusters[position] != kept_labels)):
        raise ValueError("`kept_labels` holds a cluster that does not occur in `labels`.")
    return n_ranks * sizes[position].astype(np.float64) / labels.size
