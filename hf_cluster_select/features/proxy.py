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
from collections.abc import Iterator

import torch


def find_layer_list(model: torch.nn.Module) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """The `ModuleList` of transformer blocks: the longest one whose length equals the config's
    `num_hidden_layers` (`num_layers` / `n_layer`), else the longest of all. Returns `(parent, attribute, list)`.

    Raises:
        ValueError: if the model has no `ModuleList`.
    """
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()
    expected = next((getattr(config, k) for k in ("num_hidden_layers", "num_layers", "n_layer")
                     if isinstance(getattr(config, k, None), int)), None)
    candidates = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) > 0:
                candidates.append((len(child) == expected, len(child), parent, name, child))
    if not candidates:
        raise ValueError(f"{type(model).__name__} has no ModuleList of transformer blocks to truncate.")
    _, _, parent, name, child = max(candidates, key=lambda c: (c[0], c[1]))
    return parent, name, child


@contextlib.contextmanager
def truncated_layers(model: torch.nn.Module, n_layers: int | None) -> Iterator[torch.nn.Module]:
    """Within the block, `model` runs only its first `n_layers` transformer blocks (its final norm and head are
    kept); restored on exit, also after an error. `None`, or `n_layers` >= the number of blocks: unchanged.

    Raises:
        ValueError: if `n_layers` < 1 or the model has no block list (`find_layer_list`).
    """
    if n_layers is None:
        yield model
        return
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"`feature_layers` must be an int >= 1 or None, got {n_layers!r}.")
    parent, name, layers = find_layer_list(model)
    if n_layers >= len(layers):
        yield model
        return
    setattr(parent, name, layers[:n_layers])
    try:
        yield model
    finally:
        setattr(parent, name, layers)
