"""What `ClusterSelectConfig(feature="auto")` computes for a given model (layer L2).

`auto` is the measured default (README, "Selection quality"; `benchmarks/quality.py`, `benchmarks/coverage_ni.py`):
- a **language-model head** (causal or sequence-to-sequence LM: `get_output_embeddings()` is a module) gets
  `hidden_mean` — the mean head input over the loss-bearing tokens (RDS+, Ivison et al., arXiv 2503.01807) — taken
  after the first `AUTO_DEPTH` = 2/3 of the transformer blocks (then the model's final norm; `features/proxy.py`).
  On 16 Natural-Instructions skills, SmolLM2-135M's hidden states after 20 of 30 blocks group the skills at ARI 0.81
  against 0.62 after all 30 and 0.36 for BADGE's vocabulary-projected gradient, and the feature pass costs about
  2/3 of a full one;
- a **classification head** (`score` / `classifier`) gets `badge`, BADGE's whole last-layer gradient
  `(p − onehot(y)) ⊗ h` (Ash et al., ICLR 2020), which carries the class and the error (the linear-probe and
  20 Newsgroups benchmarks chose it).

An explicit `feature_layers` overrides the depth; any other `feature` is used as given.
"""

from __future__ import annotations

import torch

from .head_tokens import resolve_head
from .proxy import find_layer_lists

AUTO_DEPTH = 2 / 3


def resolve_feature(model: torch.nn.Module, feature: str, feature_layers: int | None) -> tuple[str, int | None]:
    """`(feature, feature_layers)` to compute for `model`: `feature="auto"` resolved as the module docstring says,
    anything else returned unchanged.

    Args:
        model (`torch.nn.Module`): the model the features come from (a PEFT wrapper works).
        feature (`str`): `ClusterSelectConfig.feature`.
        feature_layers (`int` or `None`): `ClusterSelectConfig.feature_layers` (`None` = the feature's own depth).
    Returns:
        `tuple[str, int | None]`: a registered signal name and the blocks to run (`None` = all).
    Raises:
        TypeError: if `feature="auto"` and the model has no output head (`resolve_head`).
    """
    if feature != "auto":
        return feature, feature_layers
    _, token_level = resolve_head(model)
    if not token_level:
        return "badge", feature_layers
    if feature_layers is not None:
        return "hidden_mean", feature_layers
    try:
        depth = max(len(layers) for _, _, layers in find_layer_lists(model))
    except ValueError:  # no block list to truncate: every block
        return "hidden_mean", None
    blocks = max(1, round(AUTO_DEPTH * depth))
    return "hidden_mean", (blocks if blocks < depth else None)


def describe_feature(feature: str, feature_layers: int | None) -> str:
    """`"hidden_mean after 20 blocks"` / `"badge"`: the resolved feature as the report and the card state it."""
    return feature if feature_layers is None else f"{feature} after {feature_layers} blocks"
