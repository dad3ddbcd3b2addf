"""The forward pass every feature signal shares: the output head's input, logits and targets per loss token.

For a token t with head input `h_t` (the vector the output head multiplies), softmax probabilities `p_t` and target
`y_t`, the gradient of the cross-entropy with respect to the head weight `W` is `(p_t - onehot(y_t)) h_tᵀ`. A signal
(`Signal`) turns the tokens of a batch into one vector per example from these pieces; `feature_pass` runs the model
once (no backward), batched longest-first, and also returns every example's loss-bearing token count, its mean
warm-up loss (cross-entropy over those tokens) and the raw norm of its vector before L2-normalisation (the gradient
norm estimate importance sampling uses). Signals: `last_layer_grad.py` (CluSTER), `badge.py`, `hidden_mean.py`.

Cost (the forward-only limit): batches are packed by padded tokens, longest first (`inputs.token_batches`); an LM
head runs only at loss-bearing positions (`head_tokens.py`), so prompt tokens cost their transformer layers and no
`[tokens, vocab]` logits; the signal sees the loss tokens' logits in 128 MiB chunks; on CUDA (or wherever
`autocast=True`: `ClusterSelectConfig`'s `feature_precision="bf16"`) the pass runs under `torch.autocast` in bf16
(features and losses are accumulated in fp32); no KV cache is built and no activations are
kept (`torch.inference_mode()`, eval mode, so gradient checkpointing does not apply).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from .choice import forward_in_bf16
from .head_tokens import HeadTokens, _forward_keys, head_tokens, install_hooks, resolve_head
from .inputs import token_batches, validate_inputs
from .projection import RandomProjection

FEATURE_MEMMAP_BYTES = 1 << 31  # feature matrices above 2 GiB go to a memory-mapped file
INPUT_STATE_DIM = 256  # input states (`FeatureOutput.inputs`) above this size are randomly projected to it


@dataclass(frozen=True)
class FeatureOutput:
    """Output of a feature signal (`feature_pass`).

    Attributes:
        features (`torch.Tensor` of shape `[n, dim]`, float32, CPU): one row per requested index, in the order of
            `indices`; L2-normalised when asked (a zero row for an example without any loss-bearing token). Above
            2 GiB it is backed by a memory-mapped temporary file (`feature_storage`).
        loss_tokens (`torch.Tensor` of shape `[n]`, int64): number of loss-bearing tokens of each example.
        seconds (`float`): wall-clock seconds spent in the call.
        norms (`torch.Tensor` of shape `[n]`, float32, *optional*): L2 norm of each row before normalisation.
        losses (`torch.Tensor` of shape `[n]`, float32, *optional*): mean cross-entropy (nats) over each example's
            loss-bearing tokens under the model as it is (0 without loss tokens).
        inputs (`torch.Tensor` of shape `[n, r]`, float32, *optional*): with `feature_pass(input_states=True)`, each
            example's head input at its first loss-bearing token (a zero row without one): the pooled token of a
            classification head, the last prompt token of a causal LM, so it has seen no target token. `r` = the
            head input's size, or `INPUT_STATE_DIM` by a seeded random projection when that is larger.
    """

    features: torch.Tensor
    loss_tokens: torch.Tensor
    seconds: float
    norms: torch.Tensor | None = None
    losses: torch.Tensor | None = None
    inputs: torch.Tensor | None = None


class Signal(Protocol):
    """Per-token vectors of a feature signal; `feature_pass` averages them over each example's loss tokens."""

    def token_vectors(self, hidden: torch.Tensor, logits: torch.Tensor, log_p: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
        """`[c, D]` vectors from head inputs `[c, H]`, logits `[c, V]` (fp32), target log-probabilities `[c]`."""


def feature_storage(n_rows: int, dim: int, limit_bytes: int | None = None) -> torch.Tensor:
    """A zeroed float32 `[n_rows, dim]` tensor: in RAM, or — above `limit_bytes` (default `FEATURE_MEMMAP_BYTES`,
    env `HF_CLUSTER_SELECT_MEMMAP_BYTES`) — backed by a memory-mapped temporary file (unlinked at once, so it
    disappears with the process; its folder is `TMPDIR`)."""
    limit = FEATURE_MEMMAP_BYTES if limit_bytes is None else limit_bytes
    limit = int(os.environ.get("HF_CLUSTER_SELECT_MEMMAP_BYTES", limit))
    if n_rows * dim * 4 <= limit:
        return torch.zeros(n_rows, dim, dtype=torch.float32)
    handle, path = tempfile.mkstemp(prefix="hf_cluster_select_features_", suffix=".f32")
    try:
        array = np.memmap(path, dtype=np.float32, mode="w+", shape=(n_rows, dim))  # zero-filled
    finally:
        os.close(handle)
        os.unlink(path)  # the mapping stays valid; the disk space is freed when it is released
    return torch.from_numpy(array)


def _ranks_in_example(rows: torch.Tensor) -> torch.Tensor:
    """1-based rank of every loss token within its example `[k]` (tokens are in order, `rows` ascending)."""
    counts = torch.bincount(rows)
    starts = torch.cumsum(counts, 0) - counts
    return (torch.arange(rows.numel(), device=rows.device) - starts[rows] + 1).float()


def _batch_features(tokens: HeadTokens, signal: Signal) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-example means over loss tokens: vectors `[B, D]`, counts `[B]` (int64, CPU), losses `[B]` (CPU). A signal
    with `position_weighted = True` has its t-th loss token of an example weighted t (the mean is then a scaled
    position-weighted mean: same direction, which is all that cosine similarity and clustering see)."""
    device = tokens.logits.device
    sums, nll = None, torch.zeros(tokens.batch_size, dtype=torch.float32, device=device)
    ranks = _ranks_in_example(tokens.rows) if getattr(signal, "position_weighted", False) else None
    start = 0
    for rows, hidden, logits, targets in tokens.chunks():
        log_p = logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        vectors = signal.token_vectors(hidden, logits, log_p, targets)
        if ranks is not None:  # RDS+'s position weights: the t-th loss token of an example weighs t
            vectors = vectors * ranks[start:start + rows.numel(), None].to(vectors.device, vectors.dtype)
        start += rows.numel()
        if sums is None:
            sums = torch.zeros(tokens.batch_size, vectors.shape[1], dtype=torch.float32, device=device)
        sums.index_add_(0, rows.to(device), vectors.to(device, torch.float32))
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
    gather_loss_positions: bool = True,
    autocast: bool | None = None,
    input_states: bool = False,
) -> FeatureOutput:
    """One forward pass (no backward) over `dataset[indices]`, one `signal` vector per example.

    `h_t` is captured with a forward hook on `model.get_output_embeddings()` (exact whatever the norm placement)
    or, for sequence classification, on `score` / `classifier` / `classification_head` (its `out_proj` for
    RoBERTa-, BART- and T5-style heads); logits are taken in fp32. Causal LMs: `logits[:, t]` is scored against
    `labels[:, t + 1]` (tokens labelled -100 carry no loss); without `labels`, targets are the `input_ids` with
    padding (attention_mask == 0) ignored. Encoder–decoder models: labels are not shifted. Sequence classification:
    one token per example, at the position the model pools; without `labels`, the predicted class (BADGE). A batch holds at most 4·`batch_size` examples; the
    modules' training flags and hooks are restored afterwards. PEFT models work.

    Args:
        model (`torch.nn.Module`): a transformers model (or PEFT wrapper) whose forward takes the collated batch.
        dataset (map-style dataset): `dataset[i]` is what `collate_fn` takes.
        indices (`Sequence[int]`): dataset indices to compute, e.g. this rank's shard; repeats allowed.
        collate_fn (`Callable`): turns a list of items into a dict of tensors; `labels` are popped and used here
            (the model never computes a loss); keys the model's forward does not name are dropped.
        signal (`Signal`): the per-token vectors to average (`LastLayerGrad`, `Badge`, `HiddenMean`, ...).
        batch_size (`int`, *optional*, defaults to `8`): examples per forward pass of the longest examples, >= 1
            (it sets the padded-token budget of every batch).
        lengths (`Sequence[int]`, *optional*): tokens per entry of `indices`, for batching by length.
        projection (`Callable`, *optional*): applied to each `[B, D]` block before normalisation.
        projection_dim (`int`, *optional*): without `projection`, a `RandomProjection(D, projection_dim,
            projection_seed)` built for the signal's dimension `D`.
        normalize (`bool`, *optional*, defaults to `True`): L2-normalise each row (zero rows stay zero).
        show_progress (`bool`, *optional*, defaults to `True`): a tqdm bar over batches.
        desc (`str`, *optional*, defaults to `"features"`): label of the progress bar.
        shift_labels (`bool`, *optional*): whether token logits at `t` score `labels[t + 1]`; `None` = unless the
            model config says `is_encoder_decoder`.
        gather_loss_positions (`bool`, *optional*, defaults to `True`): apply an LM head only at the loss-bearing
            positions (exact: the same rows of the same head; `False` = the model's full logits, for comparison).
        autocast (`bool`, *optional*): run the forward under `torch.autocast(dtype=torch.bfloat16)`; `None` = on CUDA
            only. Otherwise the forward runs with autocast switched off, also under a Trainer's bf16 mixed precision
            (accelerate's autocast wrapper of `forward` is bypassed for the pass).
        input_states (`bool`, *optional*, defaults to `False`): also return `FeatureOutput.inputs`, the head input at
            each example's first loss-bearing token (the noise filter's input side, `selection/noise_filter.py`).
    Returns:
        `FeatureOutput`: features `[n, dim]`, loss-token counts `[n]`, raw norms `[n]`, mean losses `[n]`, seconds.
    Raises:
        TypeError: for wrong argument types, or a model without an output head.
        ValueError: if `indices` is empty or out of range, `batch_size` < 1, `lengths` does not match `indices`, a
            projection's `in_dim` differs from the signal's dimension, or labels are not class/token ids.
    """
    start_time = time.perf_counter()
    indices, lengths = validate_inputs(model, dataset, indices, collate_fn, batch_size, lengths, projection)
    head, token_level = resolve_head(model)
    accepted = _forward_keys(model)
    bf16 = forward_in_bf16(model, autocast)
    device, cast = _device_and_autocast(model, bf16)
    batches = token_batches(lengths, batch_size)
    captured: dict[str, Any] = {}
    rows = _FeatureRows(len(indices))
    inputs = _InputStates(len(indices), projection_seed) if input_states else None
    with _eval_with_hooks(model, head, captured), torch.inference_mode(), cast, \
            _forward_without_mixed_precision(model, bf16):
        for positions in tqdm(batches, desc=desc, disable=not show_progress):
            batch = collate_fn([dataset[indices[k]] for k in positions])
            tokens = head_tokens(model, batch, captured, accepted, device, shift_labels, token_level,
                                 gather_loss_positions)
            captured.clear()
            if inputs is not None:
                inputs.store(positions, tokens)
            vectors, counts, batch_losses = _batch_features(tokens, signal)
            vectors, projection = _project(vectors, projection, projection_dim, projection_seed)
            rows.store(positions, vectors, counts, batch_losses, normalize)
    output = rows.output(time.perf_counter() - start_time)
    return output if inputs is None else dataclasses.replace(output, inputs=inputs.values)


def _device_and_autocast(model: torch.nn.Module, bf16: bool) -> tuple[torch.device, Any]:
    """The model's device (CPU without parameters) and the context of its forward: `torch.autocast` in bf16 when
    `bf16` (`forward_in_bf16`), else an autocast switched off (so a Trainer's bf16 mixed precision does not leak into
    an fp32 pass; on a device without autocast, a null context)."""
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    if bf16:
        return device, torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if device.type in ("cpu", "cuda"):
        return device, torch.autocast(device_type=device.type, enabled=False)
    return device, contextlib.nullcontext()


@contextlib.contextmanager
def _forward_without_mixed_precision(model: torch.nn.Module, bf16: bool) -> Iterator[None]:
    """With `bf16` False, the model's own `forward` instead of the autocast wrapper `accelerate` installs for mixed
    precision (`Accelerator.prepare` keeps the original as `_original_forward`), restored on exit."""
    wrapped = model.__dict__.get("forward")
    original = model.__dict__.get("_original_forward")
    if bf16 or wrapped is None or original is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


@contextlib.contextmanager
def _eval_with_hooks(model: torch.nn.Module, head: torch.nn.Module, captured: dict) -> Iterator[None]:
    """`model` in eval mode with `install_hooks` on `head`; the hooks removed and every module's training flag
    restored on exit."""
    modes = [(module, module.training) for module in model.modules()]
    handles = install_hooks(head, captured)
    try:
        model.eval()
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training


def _project(vectors: torch.Tensor, projection: Callable[[torch.Tensor], torch.Tensor] | None,
             projection_dim: int | None, projection_seed: int) -> tuple[torch.Tensor, Any]:
    """A batch's `[B, D]` vectors through `projection` (without one, a `RandomProjection` built for `D` when
    `projection_dim` is set); returns them as float32 and the projection to reuse for the next batch.

    Raises:
        ValueError: if the projection's `in_dim` differs from `D`.
    """
    if projection is None and projection_dim is not None:
        projection = RandomProjection(vectors.shape[1], projection_dim, seed=projection_seed)
    if projection is not None:
        in_dim = getattr(projection, "in_dim", vectors.shape[1])
        if in_dim != vectors.shape[1]:
            raise ValueError(f"`projection` expects vectors of size {in_dim}, but the signal has size "
                             f"{vectors.shape[1]}.")
        vectors = projection(vectors).float()
    return vectors, projection


class _FeatureRows:
    """The per-example outputs of `feature_pass` for `n` requested indices, filled batch by batch."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.features: torch.Tensor | None = None
        self.norms = torch.zeros(n, dtype=torch.float32)
        self.loss_tokens, self.losses = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.float32)

    def store(self, positions: Sequence[int], vectors: torch.Tensor, counts: torch.Tensor, losses: torch.Tensor,
              normalize: bool) -> None:
        """Rows `positions` of the outputs: raw norms, the vectors (L2-normalised when asked), counts and losses."""
        rows = torch.tensor(positions, dtype=torch.int64)
        row_norms = vectors.norm(dim=1)
        self.norms[rows] = row_norms.cpu()
        if normalize:
            vectors = vectors / row_norms.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        if self.features is None:
            with torch.inference_mode(False):  # a normal tensor: callers may write to it
                self.features = feature_storage(self.n, vectors.shape[1])
        self.features[rows] = vectors.cpu()
        self.loss_tokens[rows], self.losses[rows] = counts, losses

    def output(self, seconds: float) -> FeatureOutput:
        """The `FeatureOutput` of the filled rows."""
        assert self.features is not None  # indices is non-empty
        return FeatureOutput(features=self.features, loss_tokens=self.loss_tokens, seconds=seconds,
                             norms=self.norms.clone(), losses=self.losses.clone())


def signal_features(make_signal: Callable[[dict], Signal], doc: str,
                    name: str = "features") -> Callable[..., FeatureOutput]:
    """The registry function of a signal: `(model, dataset, indices, collate_fn, **kwargs) -> FeatureOutput`, running
    `feature_pass` with `make_signal(kwargs)` (kwargs as `feature_pass` takes them); `doc` becomes its docstring."""

    def features(model: torch.nn.Module, dataset: Any, indices: Sequence[int],
                 collate_fn: Callable[[list[Any]], Mapping[str, Any]], **kwargs: Any) -> FeatureOutput:
        return feature_pass(model, dataset, indices, collate_fn, make_signal(kwargs), **kwargs)

    features.__doc__ = doc
    features.__name__ = features.__qualname__ = name
    features.input_states = True  # takes `input_states=True` (the noise filter): `pipeline.resolved_auto_settings`
    return features


class _InputStates:
    """`FeatureOutput.inputs` for `n` requested indices: the head input at every example's first loss-bearing token,
    projected to `INPUT_STATE_DIM` (seeded `RandomProjection`) when the head input is larger."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.values: torch.Tensor | None = None
        self.projection: RandomProjection | None = None

    def store(self, positions: Sequence[int], tokens: HeadTokens) -> None:
        """The rows `positions` of one batch (a zero row for an example without loss-bearing tokens)."""
        first = _ranks_in_example(tokens.rows) == 1  # tokens are in order within each example
        hidden = tokens.hidden[first].float()
        if self.values is None:
            if hidden.shape[1] > INPUT_STATE_DIM:
                self.projection = RandomProjection(hidden.shape[1], INPUT_STATE_DIM, seed=self.seed)
            with torch.inference_mode(False):
                self.values = torch.zeros(self.n, min(hidden.shape[1], INPUT_STATE_DIM), dtype=torch.float32)
        if self.projection is not None:
            hidden = self.projection(hidden).float()
        rows = torch.tensor(positions, dtype=torch.int64)[tokens.rows[first].cpu()]  # rows without one stay zero
        self.values[rows] = hidden.cpu()
