"""What the adapters decide from the model and the trainer class (layer L4): whether labels are shifted, and
whether a user's subclass overrides a hook that the cluster sampler replaces."""

from __future__ import annotations

import warnings

import torch
from transformers import GenerationMixin


def labels_are_shifted(model: torch.nn.Module) -> bool:
    """Whether the model's loss scores `logits[:, t]` against `labels[:, t + 1]`: a decoder-only model that
    generates (transformers' `GenerationMixin`, whatever the class is called) and is not encoder-decoder. PEFT and
    accelerate wrappers are looked through."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    base = getattr(base, "module", base)
    config = getattr(base, "config", None)
    return isinstance(base, GenerationMixin) and not getattr(config, "is_encoder_decoder", False)


def warn_if_sampler_overridden(cls: type) -> None:
    """Warn when a user's subclass overrides `_get_train_sampler`: the training loop's batches come from the cluster
    batch sampler, so the override would never be called."""
    owner = next((klass for klass in cls.__mro__ if "_get_train_sampler" in vars(klass)), None)
    module = getattr(owner, "__module__", "") or ""
    if owner is None or module.split(".")[0] in ("transformers", "trl", "hf_cluster_select"):
        return
    warnings.warn(
        f"{owner.__name__}._get_train_sampler is not called: {cls.__name__} draws every batch from its cluster batch "
        "sampler (warm-up on the full data, then the selected subset). To change the order, register an allocation "
        "(hf_cluster_select.registry.ALLOCATIONS) and set ClusterSelectConfig(allocation=...).",
        UserWarning, stacklevel=3)
