"""Configuration of cluster-based data selection (layer L0: imports nothing from the package)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from . import registry

FEATURES = ("auto", "last_layer_grad", "badge", "hidden_mean")
FEATURE_CONTEXTS = ("full", "loss_tokens")
CLUSTER_METHODS = ("hdbscan", "kmeans", "fine_kmeans")
NOISE_POLICIES = ("assign", "own_cluster")
WITHIN_CLUSTER = (
    "peripheral", "central", "random",  # selection/within_cluster.py
    "central_peripheral", "distance_stratified", "regime_aware", "kcenter", "kcenter_craig", "craig",
    "facility_location", "kmeanspp",  # selection/coverage_rules.py
    "drop_hard_random", "loss_stratified", "importance_norm", "importance_loss",  # selection/signal_rules.py
)
QUOTAS = ("proportional", "uniform")
BUDGET_UNITS = ("examples", "tokens")
ALLOCATIONS = ("balanced", "paper")
# 0.1 names that collide with TrainingArguments; accepted (with a FutureWarning) until 0.3
RENAMED_FIELDS = {"warmup_steps": "selection_warmup_steps", "seed": "selection_seed"}
# optional fields a command line sets as text ("None", "16"): HfArgumentParser parses `X | str | None` as str
OPTIONAL_NUMBERS = {"selection_warmup_steps": int, "projection_dim": int, "feature_batch_size": int,
                    "feature_layers": int, "hdbscan_min_cluster_size": int, "hdbscan_min_samples": int,
                    "pca_dim": int, "kmeans_n_clusters": int, "kmeans_size_cap": float, "cluster_sample_size": int}


@dataclass
class ClusterSelectConfig:
    """Settings of ClusterTrainer's warm-up → features → clustering → selection → allocation pipeline.

    Every field can be parsed from the command line with `TrainingArguments` or TRL's `SFTConfig`:
    `HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses()` (`--data_fraction 0.3
    --pca_dim None`; no field name collides with either class). Optional numeric fields are typed `int | str | None`
    so that a command line can set them to `None`: a string is parsed as on the command line ("None" → None,
    "16" → 16). `warmup_steps` and `seed`, the 0.1 names of `selection_warmup_steps` and `selection_seed`, are still
    accepted as keyword arguments and attributes with a `FutureWarning` (removed in 0.3).

    The defaults were chosen on the quality benchmarks (README, "Selection quality"; `benchmarks/probe.py`,
    `benchmarks/quality.py`, `benchmarks/coverage_ni.py`): `feature="auto"` — for a language model the mean hidden
    state over loss-bearing tokens after 2/3 of the blocks (RDS+, Ivison et al., arXiv 2503.01807), for a
    classification head BADGE's last-layer gradient (Ash et al., ICLR 2020) — fine KMeans strata
    of about `kept_per_cluster` kept examples each, facility-location medoids (the objective of CRAIG, Mirzasoleiman
    et al., ICML 2020) with uniform weights, an exact budget and token-balanced allocation. HDBSCAN (Campello et al.
    2013) is `cluster_method="hdbscan"`. `ClusterSelectConfig.paper()` returns CluSTER's published recipe (Kim et al.,
    EMNLP 2026) for comparison. Strategy names are checked against `hf_cluster_select.registry`, so a strategy a user
    registered there is accepted.

    `data_fraction` counts examples, or input tokens with `budget_unit="tokens"` (see the README's configuration
    table). Raises:
        ValueError: from `__post_init__`, naming the field and the value it got, for any out-of-range setting.
    """

    data_fraction: float = field(default=0.3, metadata={"help": "Share of the training data to keep after selection, "
                                                        "in (0, 1]: of the examples, or of the tokens (budget_unit)."})
    budget_unit: str = field(
        default="examples",
        metadata={"help": "What data_fraction counts: 'examples' (exactly that share of examples), or 'tokens' (kept "
                  "examples hold about that share of the input tokens, prompt included, each cluster its share of "
                  "them; training takes as many optimizer steps as the same share of examples would, their batches "
                  "packed by tokens; needs balance_tokens, allocation='balanced', quota='proportional').",
                  "choices": list(BUDGET_UNITS)},
    )
    selection_warmup_steps: int | str | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps on the full data before selection; None = the LR warm-up steps of "
            "TrainingArguments; 0 = select before training."
        },
    )
    feature: str = field(
        default="auto",
        metadata={
            "help": "Per-example learning-effect signal: 'auto' = 'hidden_mean' after the first 2/3 of the blocks "
            "for a language-model head, 'badge' for a classification head (features/choice.py); 'badge' = the "
            "whole last-layer gradient (p - onehot(y)) ⊗ h (BADGE; class axis projected for large vocabularies); "
            "'last_layer_grad' = its target row (p_y - 1)·h (CluSTER); 'hidden_mean' = the mean head input over "
            "loss-bearing tokens (RDS+).",
            "choices": list(FEATURES),
        },
    )
    feature_context: str = field(
        default="full",
        metadata={
            "help": "What causal-LM features see: 'full' = the whole example, pooled over loss-bearing tokens only "
            "(CluSTER); 'loss_tokens' = the loss-bearing tokens alone, so prompts do not affect the features.",
            "choices": list(FEATURE_CONTEXTS),
        },
    )
    projection_dim: int | str | None = field(
        default=None,
        metadata={"help": "Random-projection dimension of the features; None keeps the model's hidden size."},
    )
    feature_batch_size: int | str | None = field(
        default=None,
        metadata={"help": "Examples per forward pass during feature extraction; None = per-device eval batch size."},
    )
    feature_layers: int | str | None = field(
        default=None,
        metadata={"help": "Features from only the first k transformer blocks of the model (then its final norm and "
                  "head): a cheaper proxy, about k / n_layers of the feature pass; None = all blocks, except that "
                  "feature='auto' on a language model takes round(2/3 · n_layers)."},
    )
    feature_cache: bool = field(
        default=True,
        metadata={"help": "Reuse features an earlier run computed for the same data, model weights, tokenizer and "
                  "feature settings (folder: $HF_CLUSTER_SELECT_CACHE or ~/.cache/hf_cluster_select/features)."},
    )
    cluster_method: str = field(
        default="fine_kmeans",
        metadata={
            "help": "Clustering: 'fine_kmeans' = KMeans with K = budget / kept_per_cluster fine strata; 'hdbscan' = "
            "HDBSCAN's natural clusters (noise assigned); 'kmeans' = K = kmeans_n_clusters (CluSTER's mode).",
            "choices": list(CLUSTER_METHODS),
        },
    )
    kept_per_cluster: int = field(
        default=4,
        metadata={"help": "cluster_method='fine_kmeans': examples the budget keeps per cluster (K = budget / this)."},
    )
    hdbscan_min_cluster_size: int | str | None = field(
        default=None,
        metadata={"help": "HDBSCAN min_cluster_size (>= 2); None = clamp(round(sqrt(n) / 2.5), 5, 100)."},
    )
    hdbscan_min_samples: int | str | None = field(
        default=None, metadata={"help": "HDBSCAN min_samples (>= 1); None = 1 (least noise, measured best)."}
    )
    pca_dim: int | str | None = field(
        default=16,
        metadata={"help": "Dimension the L2-normalised features are reduced to by PCA before clustering; None = none."},
    )
    noise_policy: str = field(
        default="assign",
        metadata={
            "help": "What happens to HDBSCAN noise points (label -1): 'assign' = most probable cluster by "
            "membership vectors; 'own_cluster' = noise forms one extra group.",
            "choices": list(NOISE_POLICIES),
        },
    )
    kmeans_n_clusters: int | str | None = field(
        default=None,
        metadata={"help": "K for cluster_method='kmeans'; None = the world size (CluSTER's choice), at least 2."},
    )
    kmeans_size_cap: float | str | None = field(
        default=None,
        metadata={"help": "Cap on KMeans cluster sizes as a multiple of n/K (CluSTER: 1.5); None = no cap."},
    )
    cluster_sample_size: int | str | None = field(
        default=20000,
        metadata={"help": "Above this many distinct feature rows, PCA and the clusterer are fitted on a seeded sample "
                  "of this size and every other row joins the cluster of its nearest exemplar (fine_kmeans: a "
                  "coarse KMeans on the sample, then KMeans inside each coarse group); None = always fit on all "
                  "rows (benchmarks/cluster_scale.py measures where the cost bends)."},
    )
    within_cluster: str = field(
        default="facility_location",
        metadata={
            "help": "Which members represent a cluster, with what weights (selection/within_cluster.py, "
            "coverage_rules.py, signal_rules.py): 'facility_location' = greedy medoids (CRAIG's objective), "
            "uniform weights; 'craig' = the same with CRAIG weights; 'peripheral' / 'central' = farthest from / "
            "nearest to the centroid (CluSTER keeps peripheral); 'random'; 'kcenter'; 'kmeanspp'; "
            "'distance_stratified'; 'regime_aware'; 'drop_hard_random' / 'loss_stratified' (by warm-up loss); "
            "'importance_norm' / 'importance_loss' (inverse-probability weights).",
            "choices": list(WITHIN_CLUSTER),
        },
    )
    quota: str = field(
        default="proportional",
        metadata={
            "help": "How the budget is split across clusters: in proportion to size, or the same count each.",
            "choices": list(QUOTAS),
        },
    )
    balance_tokens: bool = field(
        default=True,
        metadata={"help": "Compose each optimizer micro-step so that ranks get equal padded token counts."},
    )
    allocation: str = field(
        default="balanced",
        metadata={
            "help": "'balanced' = every micro-step mixes clusters in proportion and balances tokens; 'paper' = "
            "CluSTER's one cluster per rank, loss × K·|C_k|/N per rank, selection before training (selection_warmup_steps 0).",
            "choices": list(ALLOCATIONS),
        },
    )
    balance_window: int = field(
        default=16,
        metadata={"help": "Look-ahead, in micro-steps, from which token-balanced batches are filled (an example waits at most this many steps)."},
    )
    stratify_column: str | None = field(
        default=None,
        metadata={
            "help": "A training-dataset column (task, source, language, ...): every value gets its proportional share "
            "of the budget, and clusters are split by it; None = clusters alone set the shares."
        },
    )
    selection_seed: int = field(default=42, metadata={"help": "Seed of selection and batch order (features' random "
                                                      "projection, clustering, sampling rules, batch order)."})

    def __post_init__(self) -> None:
        self._parse_text_values()
        if isinstance(self.data_fraction, bool) or not isinstance(self.data_fraction, (int, float)):
            raise TypeError(f"`data_fraction` must be a float in (0, 1], got {self.data_fraction!r}.")
        self.data_fraction = float(self.data_fraction)
        if not (0.0 < self.data_fraction <= 1.0) or math.isnan(self.data_fraction):
            raise ValueError(f"`data_fraction` must be in (0, 1], got {self.data_fraction}.")
        for name, minimum in (
            ("selection_warmup_steps", 0),
            ("projection_dim", 1),
            ("feature_batch_size", 1),
            ("hdbscan_min_cluster_size", 2),
            ("hdbscan_min_samples", 1),
            ("pca_dim", 1),
            ("kmeans_n_clusters", 2),
            ("kept_per_cluster", 1),
            ("cluster_sample_size", 100),
            ("feature_layers", 1),
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` must be an int or None, got {value!r}.")
            if value < minimum:
                raise ValueError(f"`{name}` must be >= {minimum} or None, got {value}.")
        if isinstance(self.balance_window, bool) or not isinstance(self.balance_window, int) or self.balance_window < 1:
            raise ValueError(f"`balance_window` must be an int >= 1, got {self.balance_window!r}.")
        if self.kmeans_size_cap is not None and not (float(self.kmeans_size_cap) >= 1.0):
            raise ValueError(f"`kmeans_size_cap` must be >= 1.0 or None, got {self.kmeans_size_cap}.")
        for name, allowed in (
            ("feature", FEATURES + tuple(registry.FEATURES)),
            ("feature_context", FEATURE_CONTEXTS),
            ("cluster_method", CLUSTER_METHODS + tuple(registry.CLUSTERERS)),
            ("noise_policy", NOISE_POLICIES),
            ("within_cluster", WITHIN_CLUSTER + tuple(registry.WITHIN_CLUSTER_RULES)),
            ("quota", QUOTAS),
            ("budget_unit", BUDGET_UNITS),
            ("allocation", ALLOCATIONS + tuple(registry.ALLOCATIONS)),
        ):  # built-in names, and any a user registered (hf_cluster_select.registry)
            if getattr(self, name) not in allowed:
                choices = list(dict.fromkeys(allowed))
                raise ValueError(f"`{name}` must be one of {choices}, got {getattr(self, name)!r}.")
        if self.allocation == "paper" and self.selection_warmup_steps not in (None, 0):
            raise ValueError(
                f"`allocation`='paper' selects before training (CluSTER; its batch count depends on the cluster sizes), "
                f"so `selection_warmup_steps` must be 0 or None, got {self.selection_warmup_steps}."
            )
        if self.stratify_column is not None and (not isinstance(self.stratify_column, str) or not self.stratify_column):
            raise TypeError(f"`stratify_column` must be a column name or None, got {self.stratify_column!r}.")
        for name in ("balance_tokens", "feature_cache"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be a bool, got {getattr(self, name)!r}.")
        if isinstance(self.selection_seed, bool) or not isinstance(self.selection_seed, int):
            raise TypeError(f"`selection_seed` must be an int, got {self.selection_seed!r}.")
        if self.budget_unit == "tokens" and (not self.balance_tokens or self.allocation != "balanced" or self.quota != "proportional"):
            raise ValueError("`budget_unit`='tokens' needs `balance_tokens`=True, `allocation`='balanced' (steps of a fixed "
                             "example count cannot hold a share of tokens; `paper()` sets neither) and `quota`="
                             "'proportional' ('uniform' gives clusters of short examples most of their members, more than "
                             f"the steps hold), got balance_tokens={self.balance_tokens}, allocation={self.allocation!r}, "
                             f"quota={self.quota!r}.")

    def _parse_text_values(self) -> None:
        """Command-line text of the optional fields ("None", "16", "1.5") to their values; ValueError naming the
        field for text that is neither."""
        for name, kind in OPTIONAL_NUMBERS.items():
            value = getattr(self, name)
            if isinstance(value, str):
                text = value.strip()
                if text.lower() in ("none", "null", ""):
                    setattr(self, name, None)
                    continue
                try:
                    setattr(self, name, kind(text))
                except ValueError:
                    raise ValueError(f"`{name}` must be {'an int' if kind is int else 'a number'} or None, "
                                     f"got {value!r}.") from None
        if isinstance(self.stratify_column, str) and self.stratify_column.strip().lower() in ("none", "null"):
            self.stratify_column = None

    @classmethod
    def paper(cls, **overrides: Any) -> "ClusterSelectConfig":
        """CluSTER's published recipe (Kim et al., EMNLP 2026, Sec. 3): KMeans with K = world size and sizes capped
        at 1.5·N/K, the same count per cluster, peripheral members, one cluster per rank, selection before training.

        Args:
            **overrides: any field to change from the preset (e.g. `data_fraction=0.31`).
        Returns:
            `ClusterSelectConfig` with the preset applied.
        """
        for old in RENAMED_FIELDS.keys() & overrides.keys():
            _warn_renamed(old)
        overrides = upgrade_config_dict(overrides)
        values: dict[str, Any] = dict(
            feature="last_layer_grad", selection_warmup_steps=0, cluster_method="kmeans", kmeans_size_cap=1.5,
            pca_dim=None, quota="uniform", within_cluster="peripheral", allocation="paper", balance_tokens=False,
        )
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ClusterSelectConfig":
        """Inverse of `to_dict`.

        Keys of 0.1 (`warmup_steps`, `seed`) are read as their new names, so selections saved by 0.1 still load.

        Raises:
            ValueError: if `values` holds a key that is not a field of this class.
        """
        values = upgrade_config_dict(values)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"`values` has keys that are not ClusterSelectConfig fields: {unknown}.")
        return cls(**values)

    def to_json(self) -> str:
        """JSON text of `to_dict()`."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSelectConfig":
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))

    def resolved_min_cluster_size(self, n_examples: int) -> int:
        """HDBSCAN `min_cluster_size` for `n_examples` points: the field, or clamp(round(sqrt(n) / 2.5), 5, 100),
        never more than `n_examples` and never below 2."""
        if self.hdbscan_min_cluster_size is not None:
            size = self.hdbscan_min_cluster_size
        else:
            size = min(100, max(5, round(math.sqrt(n_examples) / 2.5)))
        return max(2, min(size, n_examples))

    def resolved_min_samples(self) -> int:
        """HDBSCAN `min_samples`: the field, or 1."""
        return 1 if self.hdbscan_min_samples is None else self.hdbscan_min_samples


def upgrade_config_dict(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with the 0.1 field names (`RENAMED_FIELDS`) replaced by the current ones.

    Raises:
        TypeError: if a field is given under both its old and its new name.
    """
    values = dict(values)
    for old, new in RENAMED_FIELDS.items():
        if old in values:
            if new in values:
                raise TypeError(f"`{new}` given twice: as `{new}` and as its deprecated name `{old}`; give `{new}` only.")
            values[new] = values.pop(old)
    return values


def _warn_renamed(old: str, stacklevel: int = 3) -> None:
    warnings.warn(f"`ClusterSelectConfig.{old}` is deprecated and will be removed in 0.3 (it collides with "
                  f"`TrainingArguments.{old}`); use `{RENAMED_FIELDS[old]}`.", FutureWarning, stacklevel=stacklevel)


def _renamed_property(old: str) -> property:
    new = RENAMED_FIELDS[old]

    def get(self: ClusterSelectConfig) -> Any:
        _warn_renamed(old)
        return getattr(self, new)

    def set_(self: ClusterSelectConfig, value: Any) -> None:
        _warn_renamed(old)
        setattr(self, new, value)

    return property(get, set_, doc=f"Deprecated name of `{new}`.")


_fields_init = ClusterSelectConfig.__init__


@functools.wraps(_fields_init)
def _init_accepting_old_names(self: ClusterSelectConfig, *args: Any, **kwargs: Any) -> None:
    for old in RENAMED_FIELDS:
        if old in kwargs:
            _warn_renamed(old)
    _fields_init(self, *args, **upgrade_config_dict(kwargs))


ClusterSelectConfig.__init__ = _init_accepting_old_names  # type: ignore[method-assign]
for _old in RENAMED_FIELDS:
    setattr(ClusterSelectConfig, _old, _renamed_property(_old))
