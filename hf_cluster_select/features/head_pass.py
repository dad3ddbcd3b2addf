"""The forward pass every feature signal shares: the output head's input, logits and targets per loss token.

For a token t with head input `h_t` (the vector the output head multiplies), softmax probabilities `p_t` and target
`y_t`, the gradient of the cross-entropy with respect to the head weight `W` is `(p_t - onehot(y_t)) h_tᵀ`. A signal
(`Signal`) turns the tokens of a batch into one vector per example from these pieces; `feature_pass` runs the model
once (no backward), batched longest-first, and also returns every example's loss-bearing token count, its mean
warm-up loss (cross-entropy over those tokens) and the raw norm of its vector before L2-normalisation (the gradient
norm estimate importance sampling uses). Signals: `last_layer_grad.py` (CluSTER), `badge.py`, `hidden_mean.py`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from ..loss_tokens import IGNORE_INDEX
from .projection import RandomProjection

_HEAD_ATTRIBUTES = ("score", "classifier")
_MAX_LOGIT_ELEMENTS = 1 << 25  # fp32 logits materialised at once: 128 MiB


@dataclass(frozen=True)
class FeatureOutput:
    """Output of a feature signal (`feature_pass`).

    Attributes:
        features (`torch.Tensor` of shape `[n, dim]`, float32, CPU): one row per requested index, in the order of
            `indices`; L2-normalised when asked (a zero row for an example without any loss-bearing token).
        loss_tokens (`torch.Tensor` of shape `[n]`, int64): number of loss-bearing tokens of each example.
        seconds (`float`): wall-clock seconds spent in the call.
        norms (`torch.Tensor` of shape `[n]`, float32, *optional*): L2 norm of each row before normalisation.
        losses (`torch.Tensor` of shape `[n]`, float32, *optional*): mean cross-entropy (nats) over each example's
            loss-bearing tokens under the model as it is (0 without loss tokens).
    """

    features: torch.Tensor
    loss_tokens: torch.Tensor
    seconds: float
    norms: torch.Tensor | None = None
    losses: torch.Tensor | None = None


@dataclass
class HeadTokens:
    """The loss-bearing tokens of one batch: token `k` is position `cols[k]` of example `rows[k]`."""

    batch_size: int
    rows: torch.Tensor  # [k] int64
    cols: torch.Tensor  # [k] int64
    targets: torch.Tensor  # [k] int64
    hidden: torch.Tensor  # [B, T, H] head input
    logits: torch.Tensor  # [B, T, V]

    def chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """`(rows, h [c, H] fp32, logits [c, V] fp32, targets)` in chunks of at most 128 MiB of logits."""
        chunk = max(1, _MAX_LOGIT_ELEMENTS // self.logits.shape[-1])
        for start in range(0, self.rows.numel(), chunk):
            r, c = self.rows[start : start + chunk], self.cols[start : start + chunk]
            yield r, self.hidden[r, c].float(), self.logits[r, c].float(), self.targets[start : start + chunk]


class Signal(Protocol):
    """Per-token vectors of a feature signal; `feature_pass` averages them over each example's loss tokens."""

    def token_vectors(self, hidden: torch.Tensor, logits: torch.Tensor, log_p: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
        """`[c, D]` vectors from head inputs `[c, H]`, logits `[c, V]` (fp32), target log-probabilities `[c]`."""


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


def _validate(model, dataset, indices, collate_fn, batch_size, lengths, projection) -> tuple[list[int], list[int]]:
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



def _head_tokens(
    model: torch.nn.Module, batch: Mapping[str, Any], captured: dict, accepted: set[str], device: torch.device,
    shift_labels: bool | None = None,
) -> "HeadTokens":
    """One collated batch through the model: the head input, logits and target of every loss-bearing token."""
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
    captured.clear()
    output = model(**inputs)
    if "input" not in captured:
        raise RuntimeError("the output head was not called during the forward pass; cannot capture its input.")
    logits = output.logits if hasattr(output, "logits") else output[0]
    hidden, head_out = captured["input"], captured["output"]
    input_ids = inputs.get("input_ids")

    if logits.dim() == 3:  # token-level head: causal LM or encoder-decoder
        if labels is None:
            if input_ids is None:
                raise ValueError("the batch has neither `labels` nor `input_ids` to take targets from.")
            labels = input_ids.clone()
            if inputs.get("attention_mask") is not None:
                labels[inputs["attention_mask"] == 0] = IGNORE_INDEX
        labels = labels.to(logits.device)
        shift = not encoder_decoder if shift_labels is None else shift_labels
        if shift:  # logits[:, t] predict labels[:, t + 1], as transformers' causal-LM loss shifts them
            logits, hidden, labels = logits[:, :-1], hidden[:, :-1], labels[:, 1:]
    elif logits.dim() == 2:  # sequence classification: one "token" per example
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
        if hidden.dim() == 3:  # head applied per position, then pooled (Llama-style `score`)
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            hidden = hidden[rows, _pooled_positions(head_out, logits, input_ids, _pad_token_id(model))]
        logits, hidden, labels = logits[:, None], hidden[:, None], labels[:, None]
    else:
        raise ValueError(f"unsupported logits of shape {list(logits.shape)}; expected [B, T, V] or [B, C].")
    if hidden.shape[:2] != logits.shape[:2] or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"shapes do not line up: head input {list(hidden.shape)}, logits {list(logits.shape)}, labels "
            f"{list(labels.shape)}."
        )

    rows, cols = (labels != IGNORE_INDEX).nonzero(as_tuple=True)
    targets = labels[rows, cols]
    vocab = logits.shape[-1]
    if targets.numel() and (targets.min() < 0 or targets.max() >= vocab):
        raise ValueError(f"`labels` hold ids outside [0, {vocab}) other than {IGNORE_INDEX}.")
    return HeadTokens(logits.shape[0], rows, cols, targets, hidden, logits)


def _batch_features(tokens: HeadTokens, signal: Signal) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-example means over loss tokens: vectors `[B, D]`, counts `[B]` (int64, CPU), losses `[B]` (CPU)."""
    device = tokens.hidden.device
    sums, nll = None, torch.zeros(tokens.batch_size, dtype=torch.float32, device=device)
    for rows, hidden, logits, targets in tokens.chunks():
        log_p = logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        vectors = signal.token_vectors(hidden, logits, log_p, targets)
        if sums is None:
            sums = torch.zeros(tokens.batch_size, vectors.shape[1], dtype=torch.float32, device=device)
        sums.index_add_(0, rows.to(device), vectors.to(device))
        nll.index_add_(0, rows.to(device), -log_p.to(device))
    if sums is None:  # no loss-bearing token in the batch: zero vectors of the signal's size
        empty = tokens.hidden.new_zeros((1, tokens.hidden.shape[-1])).float()
        dim = signal.token_vectors(empty, tokens.logits.new_zeros((1, tokens.logits.shape[-1])).float(),
                                   empty.new_zeros(1), torch.zeros(1, dtype=torch.int64, device=device)).shape[1]
        sums = torch.zeros(tokens.batch_size, dim, dtype=torch.float32, device=device)
    counts = torch.bincount(tokens.rows, minlength=tokens.batch_size).to(torch.int64).cpu()
    scale = counts.clamp_min(1).to(device, torch.float32)
    return sums / scale[:, None], counts, (nll / scale).cpu()


def feature_pass(
    model: torch.nn.Module,
    dataset: Any,
    indices: Sequence[int],
    collate_fn: Callable[[list[Any]], Mapping[str, Any]],
    signal: Signal,
    *,
    batch_size: int = 8,
    lengths: Sequence[int] | None = None,
    projection: Callable[[torch.Tensor], torch.Tensor] | None = None,
    projection_dim: int | None = None,
    projection_seed: int = 0,
    normalize: bool = True,
    show_progress: bool = True,
    desc: str = "features",
    shift_labels: bool | None = None,
) -> FeatureOutput:
    """One forward pass (no backward) over `dataset[indices]`, one `signal` vector per example.

    `h_t` is the input of the model's output head, captured with a forward hook on `model.get_output_embeddings()`
    (exact whatever the norm placement) or, for sequence classification, on `score` / `classifier` (its `out_proj`
    for RoBERTa-style heads); logits are taken in fp32. Causal LMs: `logits[:, t]` is scored against
    `labels[:, t + 1]` (tokens labelled -100 carry no loss); without `labels`, targets are the `input_ids` with
    padding (attention_mask == 0) ignored. Encoder–decoder models: labels are not shifted. Sequence classification:
    one token per example, at the position the model pools; without `labels`, the predicted class (BADGE).
    Examples are batched longest-first to limit padding; the model runs in eval mode under `torch.inference_mode()`
    and its modules' training flags and hooks are restored afterwards. PEFT models work.

    Args:
        model (`torch.nn.Module`): a transformers model (or PEFT wrapper) whose forward takes the collated batch.
        dataset (map-style dataset): `dataset[i]` is what `collate_fn` takes.
        indices (`Sequence[int]`): dataset indices to compute, e.g. this rank's shard; repeats allowed.
        collate_fn (`Callable`): turns a list of items into a dict of tensors; `labels` are popped and used here
            (the model never computes a loss); keys the model's forward does not name are dropped.
        signal (`Signal`): the per-token vectors to average (`LastLayerGrad`, `Badge`, `HiddenMean`, ...).
        batch_size (`int`, *optional*, defaults to `8`): examples per forward pass, >= 1.
        lengths (`Sequence[int]`, *optional*): tokens per entry of `indices`, for batching by length.
        projection (`Callable`, *optional*): applied to each `[B, D]` block before normalisation.
        projection_dim (`int`, *optional*): without `projection`, a `RandomProjection(D, projection_dim,
            projection_seed)` built for the signal's dimension `D`.
        normalize (`bool`, *optional*, defaults to `True`): L2-normalise each row (zero rows stay zero).
        show_progress (`bool`, *optional*, defaults to `True`): a tqdm bar over batches.
        desc (`str`, *optional*, defaults to `"features"`): label of the progress bar.
        shift_labels (`bool`, *optional*): whether token logits at `t` score `labels[t + 1]`; `None` = unless the
            model config says `is_encoder_decoder`.
    Returns:
        `FeatureOutput`: features `[n, dim]`, loss-token counts `[n]`, raw norms `[n]`, mean losses `[n]`, seconds.
    Raises:
        TypeError: for wrong argument types, or a model without an output head.
        ValueError: if `indices` is empty or out of range, `batch_size` < 1, `lengths` does not match `indices`, a
            projection's `in_dim` differs from the signal's dimension, or labels are not class/token ids.
    """
    start_time = time.perf_counter()
    indices, lengths = _validate(model, dataset, indices, collate_fn, batch_size, lengths, projection)
    head = _resolve_head(model)
    accepted = _forward_keys(model)
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    order = sorted(range(len(indices)), key=lambda k: -lengths[k])  # stable, longest first: OOM shows at once
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    captured: dict[str, Any] = {}

    def hook(module, args, kwargs, output):
        captured["input"] = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        captured["output"] = output

    modes = [(module, module.training) for module in model.modules()]
    handle = head.register_forward_hook(hook, with_kwargs=True)
    n = len(indices)
    features, norms = None, torch.zeros(n, dtype=torch.float32)
    loss_tokens, losses = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.float32)
    try:
        model.eval()
        with torch.inference_mode():
            for positions in tqdm(batches, desc=desc, disable=not show_progress):
                batch = collate_fn([dataset[indices[k]] for k in positions])
                tokens = _head_tokens(model, batch, captured, accepted, device, shift_labels)
                captured.clear()
                vectors, counts, batch_losses = _batch_features(tokens, signal)
                if projection is None and projection_dim is not None:
                    projection = RandomProjection(vectors.shape[1], projection_dim, seed=projection_seed)
                if projection is not None:
                    in_dim = getattr(projection, "in_dim", vectors.shape[1])
                    if in_dim != vectors.shape[1]:
                        raise ValueError(f"`projection` expects vectors of size {in_dim}, but the signal has size "
                                         f"{vectors.shape[1]}.")
                    vectors = projection(vectors).float()
                rows = torch.tensor(positions, dtype=torch.int64)
                row_norms = vectors.norm(dim=1)
                norms[rows] = row_norms.cpu()
                if normalize:
                    vectors = vectors / row_norms.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
                if features is None:
                    features = torch.zeros(n, vectors.shape[1], dtype=torch.float32)
                features[rows] = vectors.cpu()
                loss_tokens[rows], losses[rows] = counts, batch_losses
    finally:
        handle.remove()
        for module, training in modes:
            module.training = training
    assert features is not None  # indices is non-empty
    return FeatureOutput(features=features.clone(), loss_tokens=loss_tokens, seconds=time.perf_counter() - start_time,
                         norms=norms.clone(), losses=losses.clone())


def signal_features(make_signal: Callable[[dict], Signal], doc: str) -> Callable[..., FeatureOutput]:
    """The registry function of a signal: `(model, dataset, indices, collate_fn, **kwargs) -> FeatureOutput`, running
    `feature_pass` with `make_signal(kwargs)` (kwargs as `feature_pass` takes them); `doc` becomes its docstring."""

    def features(model: torch.nn.Module, dataset: Any, indices: Sequence[int],
                 collate_fn: Callable[[list[Any]], Mapping[str, Any]], **kwargs: Any) -> FeatureOutput:
        return feature_pass(model, dataset, indices, collate_fn, make_signal(kwargs), **kwargs)

    features.__doc__ = doc
    return features
