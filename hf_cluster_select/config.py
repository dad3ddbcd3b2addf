"""Configuration of cluster-based data selection (layer L0: imports only L0 modules).

`ClusterSelectConfig` holds the settings that matter to every run; each strategy's own settings live in the
settings class registered with it (`settings.py`, `registry.py`) and are given through `strategy_kwargs`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from . import registry
from .settings import AUTO, TargetSettings, check_bool, check_choice, check_optional_int, setting_names

AUTO_FEATURE = "auto"  # not a registered signal: resolved per model by features/choice.py
BUDGET_UNITS = ("examples", "tokens")
BATCH_ORDERS = ("shuffled", "easy_to_hard")  # `order`; the curriculum lives in batching/curriculum.py
TARGET_SOURCES = ("eval",)  # `target` values besides None; a target set can also be given to the trainer
TARGET_STAGE = "target"  # the settings of targeted selection (`TargetSettings`), next to the four strategy stages


@dataclass
class ClusterSelectConfig:
    """Settings of ClusterTrainer's warm-up → features → clustering → selection → allocation pipeline.

    Four fields name a strategy (`feature`, `cluster_method`, `within_cluster`, `allocation`); each name is looked
    up in its registry (`hf_cluster_select.registry`), so a strategy a user registered there is accepted too. A
    strategy's own settings go in `strategy_kwargs`, a flat dict checked against the settings classes of the chosen
    strategies (`settings.py` and the class registered with each strategy; documented in docs/configuration.md):

        ClusterSelectConfig(data_fraction=0.2, cluster_method="hdbscan",
                            strategy_kwargs={"hdbscan_min_samples": 2, "pca_dim": 32})

    The resolved settings are `feature_settings`, `cluster_settings`, `selection_settings` and
    `allocation_settings`. From the command line, parse it next to `TrainingArguments` (or TRL's `SFTConfig`; no
    field name collides): `HfArgumentParser((TrainingArguments, ClusterSelectConfig))` with
    `--data_fraction 0.3 --cluster_method hdbscan --strategy_kwargs '{"pca_dim": null}'` (JSON text, as
    `TrainingArguments.lr_scheduler_kwargs`).

    The defaults were chosen on the quality benchmarks (benchmarks/README.md): `feature="auto"` — for a language
    model the mean hidden state over loss-bearing tokens after 2/3 of the blocks (RDS+, Ivison et al., arXiv
    2503.01807), for a classification head BADGE's last-layer gradient (Ash et al., ICLR 2020) — fine KMeans
    strata of about `kept_per_cluster` kept examples each, facility-location medoids (the objective of CRAIG,
    Mirzasoleiman et al., ICML 2020) with uniform weights, an exact budget and a cluster-mixed allocation
    (token-balanced across ranks when there are several: `balance_tokens="auto"`).
    `ClusterSelectConfig.paper()` returns CluSTER's published recipe (Kim et al., EMNLP 2026) for comparison.
    `order="easy_to_hard"` trains every epoch from easy to hard examples by their feature-pass loss (a curriculum:
    Bengio et al., ICML 2009; `batching/curriculum.py`).

    Raises:
        ValueError: from `__post_init__`, naming the field (or `strategy_kwargs` key) and the value it got.
        TypeError: for a value of the wrong type.
    """

    data_fraction: float = field(default=0.3, metadata={
        "help": "Share of the training data to keep after selection, in (0, 1]: of the examples, or of the tokens "
                "(budget_unit)."})
    budget_unit: str = field(default="examples", metadata={
        "help": "What data_fraction counts: 'examples' (exactly that share of examples), or 'tokens' (kept examples "
                "hold about that share of the input tokens, each cluster its share of them; training takes as many "
                "optimizer steps as the same share of examples would, their batches packed by tokens; needs "
                "balance_tokens, allocation='balanced', quota='proportional').",
        "choices": list(BUDGET_UNITS)})
    selection_warmup_steps: int | str | None = field(default=None, metadata={
        "help": "Optimizer steps on the full data before selection; None = the LR warm-up steps of "
                "TrainingArguments; 0 = select before training."})
    feature: str = field(default=AUTO_FEATURE, metadata={
        "help": "Per-example learning-effect signal (registry.FEATURES): 'auto' = 'hidden_mean' after 2/3 of the "
                "blocks for a language model, 'badge' for a classification head; 'badge', 'last_layer_grad' "
                "(CluSTER), 'hidden_mean', 'hidden_weighted_mean' (RDS+'s position-weighted pooling)."})
    cluster_method: str = field(default="fine_kmeans", metadata={
        "help": "Clustering (registry.CLUSTERERS): 'fine_kmeans' = KMeans strata of about kept_per_cluster kept "
                "examples; 'hdbscan' = HDBSCAN's natural clusters (noise assigned); 'kmeans' = CluSTER's K."})
    within_cluster: str = field(default="facility_location", metadata={
        "help": "Which members represent a cluster, with what weights (registry.WITHIN_CLUSTER_RULES): "
                "'facility_location' = greedy medoids (CRAIG's objective); 'peripheral' (CluSTER), 'random', ..."})
    allocation: str = field(default="balanced", metadata={
        "help": "How kept examples are dealt to ranks (registry.ALLOCATIONS): 'balanced' = every micro-step mixes "
                "clusters (and, with several ranks, balances their tokens); 'paper' = CluSTER's one cluster per "
                "rank (selection before training)."})
    strategy_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Settings of the chosen strategies, one flat dict (JSON text on a command line), e.g. "
                "{\"pca_dim\": 32, \"feature_layers\": 8}; each strategy's settings: docs/configuration.md."})
    stratify_column: str | None = field(default=None, metadata={
        "help": "A training-dataset column (task, source, language, ...): every value gets its proportional share "
                "of the budget, and clusters are split by it; None = clusters alone set the shares."})
    feature_cache: bool = field(default=True, metadata={
        "help": "Reuse features an earlier run computed for the same data, model weights, tokenizer and feature "
                "settings (folder: $HF_CLUSTER_SELECT_CACHE or ~/.cache/hf_cluster_select/features)."})
    selection_seed: int = field(default=42, metadata={
        "help": "Seed of selection and batch order (features' random projection, clustering, sampling rules, "
                "batch order)."})
    target: str | None = field(default=None, metadata={
        "help": "Targeted selection: 'eval' = keep the examples that teach the trainer's eval_dataset (a dict of "
                "eval datasets = one target task each); None = untargeted, unless the trainer is given "
                "target_dataset. Settings: target_rule, target_coverage, target_column (strategy_kwargs)."})
    order: str = field(default="shuffled", metadata={
        "help": "Order of the kept examples over each epoch: 'shuffled'; or 'easy_to_hard' = each cluster's members "
                "by increasing feature-pass loss after the warm-up (a curriculum), every micro-step still mixing the "
                "clusters. Batch order only: a resumed run may change it. Not with allocation='paper' or "
                "data_fraction=1.0.",
        "choices": list(BATCH_ORDERS)})

    def __post_init__(self) -> None:
        self._check_core_fields()
        self.strategy_kwargs = self._canonical_strategy_kwargs()
        self._check_combinations()

    # ---- validation -------------------------------------------------------------------------------------------
    def _check_core_fields(self) -> None:
        if isinstance(self.data_fraction, bool) or not isinstance(self.data_fraction, (int, float)):
            raise TypeError(f"`data_fraction` must be a float in (0, 1], got {self.data_fraction!r}.")
        self.data_fraction = float(self.data_fraction)
        if not (0.0 < self.data_fraction <= 1.0) or math.isnan(self.data_fraction):
            raise ValueError(f"`data_fraction` must be in (0, 1], got {self.data_fraction}.")
        check_choice("budget_unit", self.budget_unit, BUDGET_UNITS)
        if isinstance(self.selection_warmup_steps, str):  # command-line text: "None" or a number
            text = self.selection_warmup_steps.strip()
            try:
                self.selection_warmup_steps = None if text.lower() in ("none", "null", "") else int(text)
            except ValueError:
                raise ValueError(f"`selection_warmup_steps` must be an int >= 0 or None, got {text!r}.") from None
        check_optional_int("selection_warmup_steps", self.selection_warmup_steps, 0)
        _check_feature(self.feature)
        for name in ("cluster_method", "within_cluster", "allocation"):
            registry.STAGES[name].get(getattr(self, name))  # ValueError naming the field and the names there are
        if isinstance(self.stratify_column, str) and self.stratify_column.strip().lower() in ("none", "null"):
            self.stratify_column = None
        if self.stratify_column is not None and (not isinstance(self.stratify_column, str) or not self.stratify_column):
            raise TypeError(f"`stratify_column` must be a column name or None, got {self.stratify_column!r}.")
        check_bool("feature_cache", self.feature_cache)
        if isinstance(self.selection_seed, bool) or not isinstance(self.selection_seed, int):
            raise TypeError(f"`selection_seed` must be an int, got {self.selection_seed!r}.")
        if not 0 <= self.selection_seed <= 2**32 - 1:  # the seeds numpy and scikit-learn take
            raise ValueError(f"`selection_seed` must be in [0, 2**32 - 1], got {self.selection_seed}.")
        if isinstance(self.target, str) and self.target.strip().lower() in ("none", "null", ""):
            self.target = None
        if self.target is not None:
            check_choice("target", self.target, TARGET_SOURCES)
        check_choice("order", self.order, BATCH_ORDERS)

    def _chosen_settings_classes(self) -> dict[str, type]:
        """Stage → settings class of the chosen strategy (`feature="auto"` takes the stage's base class)."""
        return _settings_classes({stage: getattr(self, stage) for stage in registry.STAGES})

    def _canonical_strategy_kwargs(self) -> dict[str, Any]:
        """`strategy_kwargs` as a dict holding only settings that differ from their defaults, every key checked
        against the chosen strategies' settings classes (building them validates the values)."""
        given = _kwargs_dict(self.strategy_kwargs)
        classes = self._chosen_settings_classes()
        known = {name for cls in classes.values() for name in setting_names(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"`strategy_kwargs` has settings that none of the chosen strategies takes: "
                             f"{_owners_hint(unknown)}. The chosen ones take {sorted(known)}.")
        canonical = {}
        for cls in classes.values():
            values = {k: v for k, v in given.items() if k in setting_names(cls)}
            try:
                built = cls(**values)  # validates
            except (TypeError, ValueError) as error:
                raise type(error)(f"`strategy_kwargs`: {error}") from None
            canonical.update({k: getattr(built, k) for k in values if getattr(built, k) != getattr(cls(), k)})
        return dict(sorted(canonical.items()))

    def _check_combinations(self) -> None:
        if self.allocation == "paper" and self.selection_warmup_steps not in (None, 0):
            raise ValueError(
                f"`allocation`='paper' selects before training (CluSTER; its batch count depends on the cluster "
                f"sizes), so `selection_warmup_steps` must be 0 or None, got {self.selection_warmup_steps}.")
        quota, balance = self.selection_settings.quota, self.allocation_settings.balance_tokens
        if self.budget_unit == "tokens" and (balance is False or self.allocation != "balanced"
                                              or quota != "proportional"):
            raise ValueError("`budget_unit`='tokens' needs `balance_tokens`=True or 'auto', `allocation`='balanced' "
                             "(steps of a fixed example count cannot hold a share of tokens; `paper()` sets neither) and `quota`="
                             "'proportional' ('uniform' gives clusters of short examples most of their members, more "
                             f"than the steps hold), got balance_tokens={balance}, allocation={self.allocation!r}, "
                             f"quota={quota!r}.")
        if self.target is not None:
            check_target_combination(self)
        if getattr(self.cluster_settings, "sharded", False) and self.sharded_conflicts():
            raise ValueError(f"`sharded`=True (selection/sharded.py) does not implement {self.sharded_conflicts()}; "
                             "leave `sharded` off to select on rank 0.")
        if self.order == "easy_to_hard" and (self.allocation == "paper" or self.data_fraction >= 1.0):
            raise ValueError(
                f"`order`='easy_to_hard' needs `allocation`='balanced' (one cluster per rank has no global order) and "
                f"`data_fraction` < 1 (the order comes from the feature pass, which keeping everything skips), got "
                f"allocation={self.allocation!r}, data_fraction={self.data_fraction}.")

    def sharded_conflicts(self) -> list[str]:
        """The settings sharded selection (`selection/sharded.py`) does not implement, as `"name=value"` strings:
        another `cluster_method` than `fine_kmeans`, a token budget, strata, a target set, token near-duplicates,
        the noise filter (`noise_share`). Empty when it can run."""
        current = {"cluster_method": self.cluster_method, "budget_unit": self.budget_unit,
                   "stratify_column": self.stratify_column, "target": self.target,
                   "near_duplicate_threshold": (None if self.selection_settings.near_duplicate_threshold == AUTO
                                                else self.selection_settings.near_duplicate_threshold),
                   "noise_share": (0.0 if self.selection_settings.noise_share == AUTO
                                   else self.selection_settings.noise_share)}
        supported = {"cluster_method": "fine_kmeans", "budget_unit": "examples", "noise_share": 0.0}
        return [f"{name}={value!r}" for name, value in current.items() if value != supported.get(name)]

    # ---- resolved settings ------------------------------------------------------------------------------------
    def _settings(self, stage: str) -> Any:
        cls = self._chosen_settings_classes()[stage]
        return cls(**{k: v for k, v in (self.strategy_kwargs or {}).items() if k in setting_names(cls)})

    @property
    def feature_settings(self) -> Any:
        """The feature signal's settings (`settings.FeatureSettings` or the registered subclass)."""
        return self._settings("feature")

    @property
    def cluster_settings(self) -> Any:
        """The clusterer's settings (a `settings.ClusteringSettings` subclass registered with `cluster_method`)."""
        return self._settings("cluster_method")

    @property
    def selection_settings(self) -> Any:
        """The within-cluster rule's settings (`settings.SelectionSettings` or the registered subclass)."""
        return self._settings("within_cluster")

    @property
    def allocation_settings(self) -> Any:
        """The allocation's settings (`settings.AllocationSettings` or the registered subclass)."""
        return self._settings("allocation")

    @property
    def target_settings(self) -> TargetSettings:
        """Targeted selection's settings (`settings.TargetSettings`), used when the run has a target set."""
        return self._settings(TARGET_STAGE)

    def resolved(self) -> dict[str, Any]:
        """Every field but `strategy_kwargs`, and every setting of the chosen strategies with its resolved value:
        one flat dict (what selection depends on is compared on it, `saved_selection.config_differences`)."""
        values = {k: v for k, v in self.to_dict().items() if k != "strategy_kwargs"}
        for settings in (self.feature_settings, self.cluster_settings, self.selection_settings,
                         self.allocation_settings, self.target_settings):
            values.update(dataclasses.asdict(settings))
        return values

    # ---- presets and serialisation ----------------------------------------------------------------------------
    @classmethod
    def paper(cls, **overrides: Any) -> "ClusterSelectConfig":
        """CluSTER's published recipe (Kim et al., EMNLP 2026, Sec. 3): KMeans with K = world size and sizes capped
        at 1.5·N/K, the same count per cluster, peripheral members, one cluster per rank, selection before training.

        Args:
            **overrides: any field or strategy setting to change from the preset (e.g. `data_fraction=0.31`,
                `quota="proportional"`), as in `from_flat`.
        Returns:
            `ClusterSelectConfig` with the preset applied.
        """
        values: dict[str, Any] = dict(feature="last_layer_grad", selection_warmup_steps=0, cluster_method="kmeans",
                                      within_cluster="peripheral", allocation="paper", kmeans_size_cap=1.5,
                                      pca_dim=None, quota="uniform", balance_tokens=False, noise_share=0.0)
        extra = overrides.pop("strategy_kwargs", None)
        values.update(_kwargs_dict(extra))
        values.update(overrides)
        return cls.from_flat(values)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field (`strategy_kwargs` holds only settings that differ from defaults)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ClusterSelectConfig":
        """Inverse of `to_dict`.

        Raises:
            ValueError: if `values` holds a key that is not a field of this class (a strategy setting given as a
                field says where it goes now).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"`values` has keys that are not ClusterSelectConfig fields: {unknown}"
                             f"{'; strategy settings go in `strategy_kwargs`' if _owners(unknown) else ''}.")
        return cls(**values)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> "ClusterSelectConfig":
        """A config from one flat dict of fields and strategy settings (the shape of `resolved()`, or a sweep's
        `{"cluster_method": "hdbscan", "pca_dim": 32}`): keys that are not fields go into `strategy_kwargs`; the
        settings of strategies not chosen (as in another strategy's `resolved()`) are dropped when they equal their
        defaults, refused otherwise.

        Raises:
            ValueError: for a setting no chosen strategy takes with a non-default value (see `__post_init__`).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in values.items() if k in names}
        settings = _kwargs_dict(fields.pop("strategy_kwargs", None))
        settings.update({k: v for k, v in values.items() if k not in names})
        field_defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        chosen = _settings_classes({stage: fields.get(stage, field_defaults[stage]) for stage in registry.STAGES})
        takes = {name for settings_class in chosen.values() for name in setting_names(settings_class)}
        defaults = {name: takers[0][2].default for name, takers in registered_settings().items()}
        settings = {k: v for k, v in settings.items() if k in takes or k not in defaults or v != defaults[k]}
        return cls(**fields, strategy_kwargs=settings)

    def to_json(self) -> str:
        """JSON text of `to_dict()`."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSelectConfig":
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))


def _kwargs_dict(given: Any) -> dict[str, Any]:
    """`strategy_kwargs` as a new dict: `None` → `{}`, JSON text parsed.

    Raises:
        ValueError: for text that is not a JSON object. TypeError: for anything else that is not a dict of names.
    """
    if given is None:
        return {}
    if isinstance(given, str):
        try:
            given = json.loads(given) if given.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"`strategy_kwargs` must be a JSON object, got {given!r} ({error.msg}).") from None
    if not isinstance(given, dict) or not all(isinstance(k, str) for k in given):
        raise TypeError(f"`strategy_kwargs` must be a dict of setting names to values, got {given!r}.")
    return dict(given)


def _check_feature(name: Any) -> None:
    """ValueError listing `"auto"` and the registered signals, unless `name` is one of them."""
    if not isinstance(name, str) or (name != AUTO_FEATURE and name not in registry.FEATURES):
        raise ValueError(f"`feature` must be one of {[AUTO_FEATURE] + registry.FEATURES.names()}, got {name!r}.")


def _settings_classes(chosen: dict[str, Any]) -> dict[str, type]:
    """Stage → settings class of the strategy named in `chosen` (stage → name; `"auto"` → the stage's base)."""
    _check_feature(chosen["feature"])
    classes = {}
    for stage, table in registry.STAGES.items():
        name = chosen[stage]
        classes[stage] = table.base_settings if name == AUTO_FEATURE else table.settings_class(name)
    classes[TARGET_STAGE] = TargetSettings  # every target rule takes the same settings
    return classes


def registered_settings() -> dict[str, list[tuple[str, str, dataclasses.Field]]]:
    """Every setting of every registered strategy: name → `(stage, strategy, field)` of each strategy that takes it,
    in registration order (a setting shared by a stage's strategies, such as `pca_dim`, has one default)."""
    found: dict[str, list[tuple[str, str, dataclasses.Field]]] = {}
    for stage, table in registry.STAGES.items():
        for strategy in table.names():
            for field in dataclasses.fields(table.settings_class(strategy)):
                found.setdefault(field.name, []).append((stage, strategy, field))
    for field in dataclasses.fields(TargetSettings):
        found.setdefault(field.name, []).append((TARGET_STAGE, "a target set", field))
    return found


def _owners(names: list[str]) -> dict[str, list[str]]:
    """Setting name → `stage='strategy'` of every registered strategy that takes it."""
    takers = registered_settings()
    return {name: [strategy if stage == TARGET_STAGE else f"{stage}={strategy!r}" for stage, strategy, _ in takers[name]]
            for name in names if name in takers}


def _owners_hint(names: list[str]) -> str:
    owners = _owners(names)
    return ", ".join(f"{n!r}" + (f" (a setting of {' / '.join(owners[n])})" if n in owners else "") for n in names)


def check_target_combination(config: "ClusterSelectConfig") -> None:
    """Raise `ValueError` for settings targeted selection cannot follow (called for `target="eval"` here, and by the
    trainer when it is given a `target_dataset`): CluSTER's allocation (one cluster per rank, weights for the pool),
    a token budget and a `stratify_column` (both split the budget by the pool, not by the target), the noise filter
    (`noise_share`), and
    `data_fraction=1.0` (nothing to choose)."""
    if config.allocation == "paper":
        raise ValueError("a target set needs `allocation`='balanced': 'paper' (CluSTER) deals whole clusters to ranks "
                         "and weights them for the pool. Use the default allocation with a target.")
    if config.budget_unit != "examples":
        raise ValueError("a target set counts the budget in examples: use `budget_unit`='examples' with a target.")
    if config.stratify_column is not None:
        raise ValueError(f"a target set replaces `stratify_column` ({config.stratify_column!r}): the budget goes to "
                         "the target tasks (`target_column`), not to the pool's strata. Drop one of them.")
    if config.selection_settings.noise_share != AUTO and config.selection_settings.noise_share > 0:
        raise ValueError(f"a target set chooses by the target, not from the pool's candidates: `noise_share`="
                         f"{config.selection_settings.noise_share} is not used with one. Drop one of them.")
    if config.data_fraction >= 1.0:
        raise ValueError("`data_fraction`=1.0 keeps every example, so a target set has nothing to choose: lower "
                         "data_fraction, or drop the target.")
