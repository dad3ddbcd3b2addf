"""What `ClusterSelectConfig(feature="auto")` computes for a given model (layer L2).

`auto` is the measured default (README, "Selection quality"; `benchmarks/quality.py`, `benchmarks/coverage_ni.py`):
- a **language-model head** (causal or sequence-to-sequence LM: `get_output_embeddings()` is a module) gets
  `hidden_mean` — the mean head input over the loss-bearing tokens (RDS+, Ivison et al., arXiv 2503.01807) — taken
  after the first `AUTO_DEPTH` = 2/3 of the transformer blocks (then the model's final norm; `features/proxy.py`).
  On 16 Natural-Instructions skills (`benchmarks/coverage_ni.py`), SmolLM2-135M's hidden states after 20 of 30 blocks
  group the skills better than after all 30 and than BADGE's vocabulary-projected gradient (KMeans-16 ARI in
  `benchmarks/results/coverage_ni.json`), and the feature pass costs about 2/3 of a full one;
- a **classification head** (`score` / `classifier` / `classification_head`) gets `badge`, BADGE's whole
  last-layer gradient `(p − onehot(y)) ⊗ h` (Ash et al., ICLR 2020), which carries the class and the error (the
  linear-probe and 20 Newsgroups benchmarks chose it).

An explicit `feature_layers` overrides the depth; any other `feature` is used as given. A truncated pass's
per-example losses are not the model's (they come from the first blocks and the head): the pipeline keeps them from
the loss-based within-cluster rules, which fall back as their docstrings say, and the report shows no loss; they
serve only as the difficulty of `order="easy_to_hard"` (a logit-lens proxy, `batching/curriculum.py`).
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
    depth = _depth(model)
    if depth is None:  # no block list to truncate: every block
        return "hidden_mean", None
    blocks = max(1, round(AUTO_DEPTH * depth))
    return "hidden_mean", (blocks if blocks < depth else None)


def effective_layers(model: torch.nn.Module, feature_layers: int | None) -> int | None:
    """The blocks a `truncated_layers(model, feature_layers)` pass really runs: `None` when it runs them all
    (`feature_layers` is `None` or not below every block stack's depth, or the model has no block list)."""
    depth = _depth(model) if feature_layers is not None else None
    return feature_layers if depth is not None and feature_layers < depth else None


def _depth(model: torch.nn.Module) -> int | None:
    """Blocks of the model's deepest block stack (`find_layer_lists`); `None` when it has no block list."""
    try:
        return max(len(layers) for _, _, layers in find_layer_lists(model))
    except ValueError:
        return None


def feature_autocast(feature_precision: str) -> bool | None:
    """`head_pass.feature_pass`'s `autocast` for a `feature_precision` setting: `"bf16"` → True, `"fp32"` → False,
    `"auto"` → None (bf16 when the pass runs on CUDA, decided on the device the model is on at that time; on CPU
    bf16 pays only with AVX512-BF16 / AMX, so it is opt-in there)."""
    return None if feature_precision == "auto" else feature_precision == "bf16"


def forward_in_bf16(model: torch.nn.Module, autocast: bool | None) -> bool:
    """Whether the feature pass runs `model`'s forward in bf16: always for a model whose parameters are bf16
    (`torch_dtype=torch.bfloat16`: no setting makes its forward fp32), else `autocast` when set
    (`feature_autocast`), else (`"auto"`) whether the model's parameters are on CUDA now."""
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.dtype == torch.bfloat16:
        return True
    if autocast is not None:
        return bool(autocast)
    return parameter is not None and parameter.device.type == "cuda"


def describe_feature(feature: str, feature_layers: int | None, bf16: bool = False) -> str:
    """`"hidden_mean after 20 blocks"` / `"badge"` / `"badge (bf16 forward)"`: the resolved feature as the report
    and the card state it (`feature_layers` as `effective_layers` gives it; `bf16` as `forward_in_bf16` gives it)."""
    text = feature if feature_layers is None else \
        f"{feature} after {feature_layers} block{'s' if feature_layers != 1 else ''}"
    return f"{text} (bf16 forward)" if bf16 else text


def feature_used(model: torch.nn.Module, feature: str, feature_layers: int | None) -> tuple[str, int | None]:
    """`(signal name, blocks really run or None)` of a config's feature settings on `model`: `resolve_feature`,
    then `effective_layers`."""
    name, layers = resolve_feature(model, feature, feature_layers)
    return name, effective_layers(model, layers)
