"""One batch through the model: the output head's input, logits and target of every loss-bearing token (layer L2).

For a token-level head (the output embeddings of a causal LM or encoder–decoder) the head is applied only at the
loss-bearing positions: a forward pre-hook on the head replaces its `[B, T, H]` input by the `[k, H]` rows of the
`k` positions whose label bears loss, so the `[B, T, V]` logits of prompt and padding tokens are never built and
the model's own head code (norm, soft-capping, scaling) still runs. For a sequence-classification head, the head
runs as usual and its pooled row is used. `feature_pass` (head_pass.py) turns these tokens into features.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..loss_tokens import IGNORE_INDEX

_HEAD_ATTRIBUTES = ("score", "classifier", "classification_head")  # Llama/GPT-2, BERT/RoBERTa, BART/T5
MAX_LOGIT_ELEMENTS = 1 << 25  # fp32 logits a signal sees at once: 128 MiB


@dataclass
class HeadTokens:
    """The loss-bearing tokens of one batch: token `j` belongs to example `rows[j]` of the batch.

    Attributes:
        batch_size (`int`): examples in the batch `B`.
        rows (`torch.Tensor` of shape `[k]`, int64): example of each loss token.
        targets (`torch.Tensor` of shape `[k]`, int64): its target id (class or vocabulary id).
        hidden (`torch.Tensor` of shape `[k, H]`): its head input.
        logits (`torch.Tensor` of shape `[k, V]`): its logits.
    """

    batch_size: int
    rows: torch.Tensor
    targets: torch.Tensor
    hidden: torch.Tensor
    logits: torch.Tensor

    def chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """`(rows, h [c, H] fp32, logits [c, V] fp32, targets)` in chunks of at most 128 MiB of fp32 logits."""
        chunk = max(1, MAX_LOGIT_ELEMENTS // max(1, self.logits.shape[-1]))
        for start in range(0, self.rows.numel(), chunk):
            part = slice(start, start + chunk)
            yield self.rows[part], self.hidden[part].float(), self.logits[part].float(), self.targets[part]


def _resolve_head(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose input is `h`: the output embeddings (LM head), else a classification head."""
    head = None
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            head = getter()
        except (NotImplementedError, AttributeError):
            head = None
    if head is None:
        for name in _HEAD_ATTRIBUTES:
            candidate = getattr(model, name, None)
            if isinstance(candidate, torch.nn.Module):
                head = candidate
                break
    if head is None:
        raise TypeError(
            f"`model` ({type(model).__name__}) has no output head: get_output_embeddings() returned None and it has "
            f"none of the attributes {list(_HEAD_ATTRIBUTES)}."
        )
    # RoBERTa-style heads (dense → tanh → out_proj): the last linear layer is the one whose gradient we want.
    if not isinstance(getattr(head, "weight", None), torch.Tensor):
        inner = getattr(head, "out_proj", None)
        if isinstance(inner, torch.nn.Module):
            head = inner
    return head


def _forward_keys(model: torch.nn.Module) -> set[str]:
    """Named parameters of the (base) model's forward, as Trainer's `_remove_unused_columns` finds them."""
    target = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    parameters = inspect.signature(target.forward).parameters.values()
    return {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _pad_token_id(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()
    return getattr(config, "pad_token_id", None)


def _pooled_positions(
    head_out: torch.Tensor, logits: torch.Tensor, input_ids: torch.Tensor | None, pad_token_id: int | None
) -> torch.Tensor:
    """Position whose head output the model pooled into `logits` (`[B]`, int64), for heads applied per position.

    Starts from transformers' rule (rightmost token that is not `pad_token_id`, else the last position) and, for any
    row where that position's head output is not exactly the pooled logit row, takes the position that is.
    """
    batch, length = head_out.shape[:2]
    if pad_token_id is not None and input_ids is not None:
        non_pad = (input_ids.to(head_out.device) != pad_token_id).to(torch.int64)
        positions = (torch.arange(length, device=head_out.device) * non_pad).argmax(-1)
    else:
        positions = torch.full((batch,), length - 1, dtype=torch.int64, device=head_out.device)
    rows = torch.arange(batch, device=head_out.device)
    mismatch = ~(head_out[rows, positions] == logits).all(-1)
    if mismatch.any():
        distance = (head_out[mismatch].float() - logits[mismatch, None].float()).abs().sum(-1)
        positions[mismatch] = distance.argmin(-1)
    return positions


def resolve_head(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The head module whose input is `h`, and whether it is token-level (the output embeddings of an LM).

    Raises:
        TypeError: if the model has no output head.
    """
    getter = getattr(model, "get_output_embeddings", None)
    token_level = False
    if callable(getter):
        try:
            token_level = isinstance(getter(), torch.nn.Module)
        except (NotImplementedError, AttributeError):
            token_level = False
    return _resolve_head(model), token_level


def token_level_head(model: torch.nn.Module) -> bool:
    """Whether `model`'s head is token-level (`resolve_head`: a language model's output embeddings); True also for a
    model without an output head (nothing to read per-class signals from)."""
    try:
        return resolve_head(model)[1]
    except TypeError:
        return True


def _targets(labels: torch.Tensor | None, inputs: dict, shift: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows, head positions `[k]` and targets `[k]` of the loss-bearing tokens of a token-level batch."""
    if labels is None:
        input_ids = inputs.get("input_ids")
        if input_ids is None:
            raise ValueError("the batch has neither `labels` nor `input_ids` to take targets from.")
        labels = input_ids.clone()
        if inputs.get("attention_mask") is not None:
            labels[inputs["attention_mask"] == 0] = IGNORE_INDEX
    if labels.dim() != 2:
        raise ValueError(f"token-level `labels` must have shape [B, T], got {list(labels.shape)}.")
    if shift:  # logits[:, t] predict labels[:, t + 1], as transformers' causal-LM loss shifts them
        labels = labels[:, 1:]
    rows, cols = (labels != IGNORE_INDEX).nonzero(as_tuple=True)
    return rows, cols, labels[rows, cols]


def head_tokens(
    model: torch.nn.Module, batch: Mapping[str, Any], captured: dict, accepted: set[str], device: torch.device,
    shift_labels: bool | None = None, token_level: bool = False, gather: bool = True,
) -> HeadTokens:
    """One collated batch through `model`: the head input, logits and target of every loss-bearing token.

    Args:
        model (`torch.nn.Module`): the model, its head hooked by `feature_pass` (`captured` receives the head's
            input and output; `captured["gather"]` tells the pre-hook which rows to keep).
        batch (mapping of tensors): a collated batch; `labels` are popped (the model computes no loss).
        captured (`dict`): the hooks' exchange.
        accepted (`set[str]`): keys the model's forward takes.
        device (`torch.device`): where the inputs go.
        shift_labels (`bool`, *optional*): whether logits at `t` score `labels[t + 1]`; `None` = unless the model is
            an encoder–decoder.
        token_level (`bool`): whether the head is the LM's output embeddings (`resolve_head`).
        gather (`bool`, *optional*, defaults to `True`): apply a token-level head only at the loss positions.
    Returns:
        `HeadTokens` with `[k, H]` head inputs and `[k, V]` logits.
    Raises:
        TypeError: if `batch` is not a mapping.
        ValueError: for labels that are not class/token ids, or shapes that do not line up.
        RuntimeError: if the head was not called during the forward pass.
    """
    inputs, labels, encoder_decoder = _model_inputs(model, batch, accepted, device)
    shift = not encoder_decoder if shift_labels is None else bool(shift_labels)
    captured.clear()
    planned = None
    if token_level:
        planned = _targets(None if labels is None else labels.to(device), inputs, shift)
        if gather:
            captured["gather"] = planned[:2]
    output = model(**inputs)
    if "input" not in captured:
        raise RuntimeError("the output head was not called during the forward pass; cannot capture its input.")
    logits = output.logits if hasattr(output, "logits") else output[0]
    hidden, head_out = captured["input"], captured["output"]
    if captured.get("gathered"):
        rows, _, targets = planned
        if logits.shape[0] != rows.numel():
            raise RuntimeError(f"the model changed the head's gathered output: {rows.numel()} loss tokens, logits of "
                               f"shape {list(logits.shape)}; pass `gather_loss_positions=False`.")
    elif logits.dim() == 3:  # token-level head applied everywhere (gathering off, or not an output embedding)
        rows, cols, targets = planned if planned is not None else _targets(
            None if labels is None else labels.to(device), inputs, shift)
        logits, hidden = logits[rows, cols], hidden[rows, cols]
    elif logits.dim() == 2:  # sequence classification: one "token" per example
        labels = _class_labels(labels, logits)
        rows = torch.arange(logits.shape[0], device=logits.device)
        if hidden.dim() == 3:  # head applied per position, then pooled (Llama-style `score`)
            hidden = hidden[rows, _pooled_positions(head_out, logits, inputs.get("input_ids"), _pad_token_id(model))]
        keep = labels != IGNORE_INDEX
        rows, targets, logits, hidden = rows[keep], labels[keep], logits[keep], hidden[keep]
    else:
        raise ValueError(f"unsupported logits of shape {list(logits.shape)}; expected [B, T, V] or [B, C].")
    _check_tokens(hidden, logits, targets)
    sizes = [v.shape[0] for v in (*inputs.values(), labels) if isinstance(v, torch.Tensor) and v.dim() > 0]
    batch_size = sizes[0] if sizes else int(rows.max()) + 1
    return HeadTokens(int(batch_size), rows, targets, hidden, logits)


def _model_inputs(model: torch.nn.Module, batch: Mapping[str, Any], accepted: set[str],
                  device: torch.device) -> tuple[dict, torch.Tensor | None, bool]:
    """The forward's inputs on `device` (keys it takes, no KV cache, decoder inputs built from the labels), the
    popped `labels` (or None), and whether the model is an encoder–decoder.

    Raises:
        TypeError: if `batch` is not a mapping.
        ValueError: if an encoder–decoder batch has no `labels`.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"`collate_fn` must return a mapping of tensors, got {type(batch).__name__}.")
    batch = dict(batch)
    labels = batch.pop("labels", None)
    inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items() if k in accepted}
    if "use_cache" in accepted:
        inputs["use_cache"] = False
    config = getattr(model, "config", None)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and labels is None:
        raise ValueError("encoder-decoder models need `labels` in the collated batch.")
    if encoder_decoder and "decoder_input_ids" not in inputs and callable(
        getattr(model, "prepare_decoder_input_ids_from_labels", None)
    ):
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels.to(device))
    return inputs, labels, encoder_decoder


def _class_labels(labels: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    """Sequence-classification targets `[B]` on the logits' device: the class ids given (`[B]` or `[B, 1]`), or
    BADGE's hypothesised label (the predicted class) without labels.

    Raises:
        ValueError: for labels that are not class ids of shape `[B]` (regression, multi-label).
    """
    if labels is None:  # BADGE's hypothesised label
        labels = logits.argmax(-1)
    labels = labels.to(logits.device)
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.dim() != 1 or labels.is_floating_point():
        raise ValueError(
            f"sequence-classification `labels` must be class ids of shape [B]; got dtype {labels.dtype}, shape "
            f"{list(labels.shape)} (regression and multi-label targets are not supported)."
        )
    return labels


def _check_tokens(hidden: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
    """Raise `ValueError` unless head inputs `[k, H]`, logits `[k, V]` and targets `[k]` line up and every target
    is an id in `[0, V)`."""
    if hidden.shape[0] != logits.shape[0] or targets.shape[0] != logits.shape[0]:
        raise ValueError(f"shapes do not line up: head input {list(hidden.shape)}, logits {list(logits.shape)}, "
                         f"targets {list(targets.shape)}.")
    vocab = logits.shape[-1]
    if targets.numel() and (targets.min() < 0 or targets.max() >= vocab):
        raise ValueError(f"`labels` hold ids outside [0, {vocab}) other than {IGNORE_INDEX}.")


def install_hooks(head: torch.nn.Module, captured: dict) -> list:
    """Hooks on `head`: a pre-hook that keeps only the rows named by `captured["gather"]` (set per batch by
    `head_tokens`) and a hook that stores the head's input and output. Returns the handles to remove."""

    def pre_hook(module, args, kwargs):
        plan = captured.get("gather")
        if plan is None:
            return None
        key = None if args else next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        hidden = args[0] if args else kwargs[key]
        rows, cols = plan
        if hidden.dim() != 3 or (cols.numel() and int(cols.max()) >= hidden.shape[1]):
            return None  # not the [B, T, H] head input expected: leave the call alone
        captured["gathered"] = True
        gathered = hidden[rows.to(hidden.device), cols.to(hidden.device)]
        if args:
            return (gathered, *args[1:]), kwargs
        return args, {**kwargs, key: gathered}

    def hook(module, args, kwargs, output):
        captured["input"] = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        captured["output"] = output

    return [head.register_forward_pre_hook(pre_hook, with_kwargs=True),
            head.register_forward_hook(hook, with_kwargs=True)]
