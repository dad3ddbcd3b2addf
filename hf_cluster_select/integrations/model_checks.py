"""What the adapters decide from the model and the trainer class (layer L4): whether labels are shifted, and
whether a user's subclass overrides a hook whose override would silently drop the sampler or the loss weights."""

from __future__ import annotations

import ast
import inspect
import textwrap
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


def _user_owner(cls: type, name: str) -> type | None:
    """The class in `cls.__mro__` that defines `name`, when it is a user's (not transformers', TRL's or ours)."""
    owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
    module = getattr(owner, "__module__", "") or ""
    return None if owner is None or module.split(".")[0] in ("transformers", "trl", "hf_cluster_select") else owner


def _reaches_parent(function: object, name: str) -> bool | None:
    """Whether `function`'s source refers to `.name` (as `super().name(...)` or `SomeTrainer.name(self, ...)` do);
    `None` when the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    return any(isinstance(node, ast.Attribute) and node.attr == name
               for statement in body for node in ast.walk(statement))


def warn_if_hooks_overridden(cls: type) -> None:
    """Warn once per class, at construction, when a user's subclass overrides a hook whose override would silently
    drop what the trainer does:

    - `_get_train_sampler`: never called; every batch comes from the cluster batch sampler.
    - `get_train_dataloader`: used for the warm-up only; the subset's batches come from the cluster batch sampler.
    - `compute_loss` that never reaches the parent's (`super().compute_loss(...)`): the selected examples' loss
      weights are not applied.
    """
    if cls in _WARNED:
        return
    _WARNED.add(cls)
    order_hint = ("To change the order, register an allocation (hf_cluster_select.registry.ALLOCATIONS) and set "
                  "ClusterSelectConfig(allocation=...).")
    if (owner := _user_owner(cls, "_get_train_sampler")) is not None:
        warnings.warn(f"{owner.__name__}._get_train_sampler is not called: {cls.__name__} draws every batch from its "
                      "cluster batch sampler (warm-up on the full data, then the selected subset). " + order_hint,
                      UserWarning, stacklevel=3)
    if (owner := _user_owner(cls, "get_train_dataloader")) is not None:
        warnings.warn(f"{owner.__name__}.get_train_dataloader is used for the warm-up only: after selection, "
                      f"{cls.__name__} builds the subset's DataLoader itself (with TrainingArguments' dataloader_* "
                      "settings). " + order_hint, UserWarning, stacklevel=3)
    owner = _user_owner(cls, "compute_loss")
    if owner is not None and _reaches_parent(vars(owner)["compute_loss"], "compute_loss") is False:
        warnings.warn(f"{owner.__name__}.compute_loss does not call the parent's compute_loss, so the selected "
                      "examples' loss weights are not applied (training is unweighted). Compute your loss with "
                      "`super().compute_loss(model, inputs, return_outputs, num_items_in_batch)`, or override "
                      "`_cs_weighted_loss(model, inputs, weights, ...)` to weight a loss of your own.",
                      UserWarning, stacklevel=3)


_WARNED: set[type] = set()  # classes already checked (a trainer built in a loop warns once)
