"""Cheaper feature models (layer L2): the first k transformer layers of the trained model, or another model.

`truncated_layers(model, k)` runs the model with only its first `k` blocks (then its own final norm and head): a
built-in proxy whose feature pass costs about `k / n_layers` of the full one for a deep model, with no second model
in memory. A smaller model sharing the tokenizer (S2L, Yang et al., 2024, selects with a 100× smaller proxy;
"Compute-Constrained Data Selection", ICLR 2025, finds gradient-based selection compute-optimal only with a much
smaller selector) is passed as `ClusterTrainer(feature_model=...)`. `benchmarks/overhead.py` measures the cost ratio
of each and how far its selection agrees with the full model's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch


def _depths(model: torch.nn.Module) -> set[int]:
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()
    names = ("num_hidden_layers", "num_layers", "n_layer", "num_decoder_layers", "decoder_layers", "encoder_layers")
    return {getattr(config, k) for k in names if isinstance(getattr(config, k, None), int)}


def find_layer_lists(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.ModuleList]]:
    """The `ModuleList`s of transformer blocks, as `(parent, attribute, list)`: every one whose length is a layer
    count of the config (`num_hidden_layers`, `num_layers`, `num_decoder_layers`, ...: the encoder and the decoder
    stack of an encoder–decoder model), else the longest `ModuleList`.

    Raises:
        ValueError: if the model has no `ModuleList`.
    """
    depths = _depths(model)
    candidates = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
                  if isinstance(child, torch.nn.ModuleList) and len(child) > 0]
    if not candidates:
        raise ValueError(f"{type(model).__name__} has no ModuleList of transformer blocks to truncate.")
    stacks = [c for c in candidates if len(c[2]) in depths]
    return stacks or [max(candidates, key=lambda c: len(c[2]))]


def find_layer_list(model: torch.nn.Module) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """The longest block list of `find_layer_lists` (the decoder stack of a decoder-only model)."""
    return max(find_layer_lists(model), key=lambda c: len(c[2]))


@contextlib.contextmanager
def truncated_layers(model: torch.nn.Module, n_layers: int | None) -> Iterator[torch.nn.Module]:
    """Within the block, `model` runs only the first `n_layers` blocks of each of its block stacks (an
    encoder–decoder model: of the encoder and of the decoder); its final norms and head are kept; restored on exit,
    also after an error. `None`: unchanged. `n_layers` >= every stack's depth: unchanged, with a warning.

    Raises:
        ValueError: if `n_layers` < 1 or the model has no block list (`find_layer_lists`).
    """
    if n_layers is None:
        yield model
        return
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"`feature_layers` must be an int >= 1 or None, got {n_layers!r}.")
    stacks = [(parent, name, layers) for parent, name, layers in find_layer_lists(model) if len(layers) > n_layers]
    if not stacks:
        warnings.warn(f"`feature_layers`={n_layers} is not below the model's depth "
                      f"({max(len(c[2]) for c in find_layer_lists(model))} blocks): features use every block.",
                      UserWarning, stacklevel=3)
    for parent, name, layers in stacks:
        setattr(parent, name, layers[:n_layers])
    try:
        yield model
    finally:
        for parent, name, layers in stacks:
            setattr(parent, name, layers)
