"""Per-strategy settings: small frozen dataclasses registered with their strategy (layer L0: imports nothing).

`ClusterSelectConfig` keeps what matters to every run; a strategy's own settings (HDBSCAN's `min_samples`, the
fine-KMeans stratum size, the token-balance window, ...) live in the settings class registered with that strategy
(`Registry.register(name, settings=...)`), the way peft keeps one config class per tuner. A user sets them through
`ClusterSelectConfig(strategy_kwargs={...})`; the config builds the settings of every chosen strategy from it,
and each default is written once, here or next to the strategy that owns it.

Every stage has a base class whose settings apply to all its strategies:

- `FeatureSettings` (`feature`): `feature_context`, `projection_dim`, `feature_batch_size`, `feature_layers`,
  `feature_precision`.
- `ClusteringSettings` (`cluster_method`): `pca_dim`, `cluster_sample_size`; subclasses add their own
  (`selection.kmeans_clusterer`, `selection.hdbscan_clusterer`).
- `SelectionSettings` (`within_cluster`): `quota`, `near_duplicate_threshold`, `duplicate_weight`.
- `AllocationSettings` (`allocation`): `balance_tokens`, `balance_window`, `reset_optimizer_state`.
- `TargetSettings` (targeted selection, when the run has a target set): `target_rule`, `target_coverage`,
  `target_column`.

A settings class validates itself in `__post_init__` (`ValueError` naming the setting and the value it got) and
declares each field's `metadata={"help": ...}` (and `"choices"` for an enumeration), like `ClusterSelectConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ._checks import check_real

AUTO = "auto"  # the value of a setting resolved per run (`resolve_balance_tokens`, `resolve_duplicates`)


def check_int_setting(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """Raise `ValueError` unless `value` is an int (not a bool) >= `minimum`, or None when `optional`; the message
    names `name`."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}{' or None' if optional else ''}, got {value!r}.")


def check_optional_int(name: str, value: Any, minimum: int) -> None:
    """`check_int_setting` of a setting that may be None."""
    check_int_setting(name, value, minimum, optional=True)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise `ValueError` unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")


def check_bool(name: str, value: Any) -> None:
    """Raise `TypeError` unless `value` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {value!r}.")


def is_auto_bool(name: str, value: Any) -> bool:
    """Whether a bool setting that also takes `"auto"` is `"auto"`.

    Raises:
        TypeError: if `value` is neither a bool nor `"auto"`.
    """
    if isinstance(value, str) and value == AUTO:
        return True
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True, False or 'auto', got {value!r}.")
    return False


def choices_of(settings_class: type, name: str) -> tuple[str, ...]:
    """The `"choices"` declared in the metadata of field `name` of `settings_class`."""
    return tuple(next(f for f in dataclasses.fields(settings_class) if f.name == name).metadata["choices"])


def setting_names(settings_class: type) -> list[str]:
    """Field names of a settings dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(settings_class)]


@dataclass(frozen=True)
class FeatureSettings:
    """Settings of every feature signal (`feature`).

    Attributes:
        feature_context (`str`, defaults to `"full"`): what causal-LM features see (see the field's help).
        projection_dim (`int`, *optional*): random-projection dimension; `None` keeps the model's hidden size.
        feature_batch_size (`int`, *optional*): examples per feature forward pass; `None` = the per-device eval
            batch size.
        feature_layers (`int`, *optional*): features from the first k transformer blocks (then the final norm and
            head); `None` = all blocks, except that `feature="auto"` on a language model takes round(2/3 · n_layers).
        feature_precision (`str`, defaults to `"auto"`): the feature pass's forward in `"bf16"` (`torch.autocast`,
            features accumulated in fp32) or `"fp32"` (also under a Trainer's bf16 mixed precision); `"auto"` = bf16
            on CUDA, fp32 elsewhere. A model whose weights are bf16 runs its forward in bf16 whatever this says; the
            report's `feature_used` then says "(bf16 forward)".
    Raises:
        ValueError: for a value out of range (named).
    """

    feature_context: str = field(default="full", metadata={
        "help": "What causal-LM features see: 'full' = the whole example, pooled over loss-bearing tokens only "
                "(CluSTER); 'loss_tokens' = the loss-bearing tokens alone, so prompts do not affect the features.",
        "choices": ["full", "loss_tokens"]})
    projection_dim: int | None = field(default=None, metadata={
        "help": "Random-projection dimension of the features; None keeps the model's hidden size."})
    feature_batch_size: int | None = field(default=None, metadata={
        "help": "Examples per forward pass of the feature pass; None = per-device eval batch size."})
    feature_layers: int | None = field(default=None, metadata={
        "help": "Features from only the first k transformer blocks (then the model's final norm and head): about "
                "k / n_layers of the feature pass; None = all blocks, except that feature='auto' on a language "
                "model takes round(2/3 · n_layers)."})
    feature_precision: str = field(default="auto", metadata={
        "help": "Precision of the feature pass's forward: 'bf16' (torch.autocast; features and losses accumulated in "
                "fp32), 'fp32' (also under a Trainer's bf16 mixed precision), or 'auto' = bf16 on CUDA, fp32 "
                "elsewhere. On a CPU with AVX512-BF16, 'bf16' made the pass 2.6-2.8x cheaper (benchmarks/overhead.py).",
        "choices": ["auto", "bf16", "fp32"]})

    def __post_init__(self) -> None:
        check_choice("feature_context", self.feature_context, choices_of(FeatureSettings, "feature_context"))
        check_choice("feature_precision", self.feature_precision, choices_of(FeatureSettings, "feature_precision"))
        for name in ("projection_dim", "feature_batch_size", "feature_layers"):
            check_optional_int(name, getattr(self, name), 1)


@dataclass(frozen=True)
class ClusteringSettings:
    """Settings of every clusterer (`cluster_method`).

    Attributes:
        pca_dim (`int`, *optional*, defaults to `16`): PCA dimension of the L2-normalised features before
            clustering; `None` = no PCA.
        cluster_sample_size (`int`, *optional*, defaults to `20000`): above this many distinct rows, PCA and the
            clusterer are fitted on a seeded sample and the other rows join their nearest exemplar's cluster;
            `None` = always fit on all rows.
    Raises:
        ValueError: for a value out of range (named).
    """

    pca_dim: int | None = field(default=16, metadata={
        "help": "Dimension the L2-normalised features are reduced to by PCA before clustering; None = none."})
    cluster_sample_size: int | None = field(default=20000, metadata={
        "help": "Above this many distinct feature rows, PCA and the clusterer are fitted on a seeded sample of this "
                "size and every other row joins the cluster of its nearest exemplar; None = always fit on all rows."})

    def __post_init__(self) -> None:
        check_optional_int("pca_dim", self.pca_dim, 1)
        check_optional_int("cluster_sample_size", self.cluster_sample_size, 100)


@dataclass(frozen=True)
class SelectionSettings:
    """Settings of every within-cluster rule (`within_cluster`).

    Attributes:
        quota (`str`, defaults to `"proportional"`): how the budget is split over clusters (`quotas.cluster_quotas`).
        near_duplicate_threshold (`float`, `None` or `"auto"`, defaults to `"auto"`): also merge examples whose
            token 3-grams have a Jaccard similarity of at least this with their group's first, in (0, 1], into
            duplicate groups (`selection/near_duplicates.py`: MinHash + LSH over `input_ids`, pairs verified
            exactly; where the examples say which tokens carry the loss, their replies must be near copies too;
            skipped without `input_ids`); `None` = only rows with identical features are merged. `"auto"`
            (`resolve_duplicates`) = `AUTO_NEAR_DUPLICATE_THRESHOLD` (0.7) for a model with a classification head
            and for a language model whose examples give their replies (a prompt masked before them: token `labels`
            or TRL's `completion_mask` / `assistant_masks`, `data.has_replies`); `None` for other language-model rows
            (rows of one task of a multi-task pool, under a long shared instruction, would merge) and for sharded
            selection. Measured (`benchmarks/README.md`, "Noisy and redundant pools"): with 60 % duplicated rows
            0.7 with `duplicate_weight="one"` beat the selection without it on every seed of 20 Newsgroups, skill
            classification and Natural-Instructions SFT at f = 0.1 and 0.3; clean pools: a tie (SFT: nothing merged).
        duplicate_weight (`str`, defaults to `"auto"`): what a duplicate group's kept copy stands for: `"group"` =
            all its copies (its weight × the group's size: repetition kept as part of the mixture), `"one"` = itself
            (the copies' mass is dropped and the weights rescaled to sum to n, as SemDeDup drops them); `"auto"` =
            `"one"` where `near_duplicate_threshold="auto"` turns the token check on, else `"group"`.
        noise_share (`float` or `"auto"`, defaults to `"auto"`): fraction 0–1, in [0, 1), of every cluster to treat
            as suspected label or reply noise: that share of its examples whose target agrees least with those of
            their input neighbours (`selection/noise_filter.py`, Deep k-NN, Bahri et al., ICML 2020) is deferred,
            kept only when the budget needs them. 0 = off. `"auto"`, where the filter can run: for a classification
            head `AUTO_NOISE_SHARE` (0.2), or the pool's estimated noise rate (`noise_filter.estimated_noise_rate`,
            the share of examples whose feature points against their neighbours', at most 0.5) when that is at
            least `NOISY_POOL_RATE` (0.3); for a language model 0.2 when at least `NOISY_REPLY_SHARE` (0.1) of the
            replies disagree with their prompt neighbours' (`noise_filter.reply_disagreement`), else 0 (off)
            (`resolve_noise_share`). A number is used as given: set it near the pool's noise rate when known. A
            number > 0 is refused with a target set or sharded selection (`"auto"` turns the filter off there). The
            feature pass also keeps each example's input state (`[n_examples, 256]` at most, stored in the feature
            cache with the features). Measured in `benchmarks/README.md` ("Noisy and redundant pools").
        noise_neighbors (`int`, defaults to `10`): neighbours per example of the noise filter, >= 1.
    Raises:
        ValueError: for an unknown quota or duplicate weight, a threshold outside (0, 1], a `noise_share` outside
            [0, 1) or `noise_neighbors` < 1.
    """

    quota: str = field(default="proportional", metadata={
        "help": "How the budget is split across clusters: in proportion to size, or the same count each.",
        "choices": ["proportional", "uniform"]})
    near_duplicate_threshold: float | str | None = field(default="auto", metadata={
        "help": "Merge examples whose token 3-grams have a Jaccard similarity of at least this, in "
                "(0, 1], into one candidate (MinHash + LSH over input_ids); None = only identical features merge; "
                "'auto' = 0.7 for a classification head and for a language model whose rows give their replies "
                "(token labels, completion_mask), None for other language-model rows and for sharded selection."})
    duplicate_weight: str = field(default="auto", metadata={
        "help": "What the kept copy of a duplicate group stands for: 'group' = all its copies (weight × group "
                "size); 'one' = itself (the copies' weight is dropped, the rest rescaled to sum to n); 'auto' = "
                "'one' where near_duplicate_threshold='auto' turns the token check on, else 'group'.",
        "choices": ["auto", "group", "one"]})
    noise_share: float | str = field(default="auto", metadata={
        "help": "Fraction in [0, 1) of every cluster to defer as suspected label/reply noise: the examples whose "
                "target agrees least with their input neighbours' (k-NN agreement); 0 = off; 'auto' = for a "
                "classification head 0.2, or the estimated noise rate (up to 0.5) when it is 0.3 or more; for a "
                "language model 0.2 when 0.1 or more of the replies disagree with their prompt neighbours', else 0; "
                "0 for a target set, sharded selection or a user feature."})
    noise_neighbors: int = field(default=10, metadata={
        "help": "Neighbours per example of the noise filter (noise_share), >= 1."})

    def __post_init__(self) -> None:
        check_choice("quota", self.quota, choices_of(SelectionSettings, "quota"))
        if self.noise_share != AUTO:
            object.__setattr__(self, "noise_share", check_real(
                "noise_share", self.noise_share, lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1) or 'auto'"))
        check_int_setting("noise_neighbors", self.noise_neighbors, 1)
        value = self.near_duplicate_threshold
        if value is not None and value != AUTO:
            object.__setattr__(self, "near_duplicate_threshold", check_real(
                "near_duplicate_threshold", value, lambda v: 0.0 < v <= 1.0, "a float in (0, 1], None or 'auto'"))
        check_choice("duplicate_weight", self.duplicate_weight, choices_of(SelectionSettings, "duplicate_weight"))


@dataclass(frozen=True)
class AllocationSettings:
    """Settings of every allocation (`allocation`).

    Attributes:
        balance_tokens (`bool` or `"auto"`, defaults to `"auto"`): compose micro-steps so that ranks get equal
            padded tokens (token-budget batches: long examples in small batches, short ones in large). `"auto"` =
            on with several ranks (or `budget_unit="tokens"`), off on one process, where there is nothing to balance
            and the variable batches cost quality at equal steps: on `benchmarks/targeted.py` the same kept rows in
            fixed batches were better on 18 of 18 seed × setting pairs (−0.01 to −0.30 nats per setting), and on
            `quality.py` at f = 0.3 on 3 of 3 seeds of Natural-Instructions and 20 Newsgroups; on targeted
            20 Newsgroups they were 1–20 points lower (7 of 12 seeds). A checkpoint resumes with the batches of
            the current setting: set `True` to resume a one-process run started before `"auto"` with its batches.
        balance_window (`int`, defaults to `16`): look-ahead in micro-steps of the token balancing.
        reset_optimizer_state (`bool` or `"auto"`, defaults to `"auto"`): clear the optimizer's per-parameter state
            (Adam's moment estimates and step count) when training on the kept subset starts, after the warm-up; the
            weights and the LR schedule carry on, and Adam restarts its bias correction. The warm-up's moments come
            from the full pool, label noise included; LESS (Xia et al., arXiv 2402.04333) likewise does not carry
            its warm-up's training into the training on the selected data. `"auto"` clears it when the noise filter
            estimated the pool noisy (`noise_rate_estimate` >= `NOISY_POOL_RATE`, 0.3;
            `resolve_reset_optimizer_state`), so only with a classification head and `noise_share="auto"`. Measured
            in `benchmarks/README.md` ("Noisy and redundant pools"). Ignored under DeepSpeed, whose engine owns the
            optimizer state (a warning; nothing is cleared).
    Raises:
        ValueError: if `balance_window` < 1. TypeError: if `balance_tokens` or `reset_optimizer_state` is not a
            bool or `"auto"`.
    """

    balance_tokens: bool | str = field(default="auto", metadata={
        "help": "Compose each optimizer micro-step so that ranks get equal padded token counts: true, false or "
                "'auto' (on with several ranks or a tokens budget, off on one process)."})
    balance_window: int = field(default=16, metadata={
        "help": "Look-ahead, in micro-steps, from which token-balanced batches are filled (an example waits at "
                "most this many steps)."})
    reset_optimizer_state: bool | str = field(default="auto", metadata={
        "help": "Clear the optimizer's state (Adam's moments) when training on the kept subset starts, after the "
                "warm-up on the full pool; weights and LR schedule carry on: true, false or 'auto' (on when the "
                "noise filter estimated the pool's noise rate at 0.3 or more). Ignored (a warning) under DeepSpeed."})

    def __post_init__(self) -> None:
        is_auto_bool("balance_tokens", self.balance_tokens)
        check_int_setting("balance_window", self.balance_window, 1)
        is_auto_bool("reset_optimizer_state", self.reset_optimizer_state)


def resolve_balance_tokens(balance_tokens: bool | str, world_size: int, budget_unit: str = "examples") -> bool:
    """`balance_tokens` as a bool: `"auto"` is on with `world_size` > 1 ranks or a `budget_unit` of `"tokens"` (token
    budgets need token-packed batches), off on one process.

    Raises:
        TypeError: if `balance_tokens` is neither a bool nor `"auto"`.
    """
    if is_auto_bool("balance_tokens", balance_tokens):
        return int(world_size) > 1 or budget_unit == "tokens"
    return balance_tokens


# `near_duplicate_threshold="auto"`: the measured setting (benchmarks/README.md, "Noisy and redundant pools": 20
# Newsgroups, skill classification and Natural-Instructions / MathQA SFT (with replies) with duplicated rows)
AUTO_NEAR_DUPLICATE_THRESHOLD = 0.7


def resolve_duplicates(settings: SelectionSettings, *, token_level: bool, token_check: bool = True,
                       replies: bool = False) -> tuple[float | None, str]:
    """`(near_duplicate_threshold, duplicate_weight)` with `"auto"` resolved (values given explicitly are kept).

    Args:
        settings (`SelectionSettings`): the run's selection settings.
        token_level (`bool`): whether the model's loss is per token (a language-model head) rather than per
            example: rows of an SFT pool often share a long prompt, so the check needs their replies there.
        token_check (`bool`, *optional*, defaults to `True`): whether this path can run the token check at all
            (`False` for sharded selection and for features given without their examples).
        replies (`bool`, *optional*, defaults to `False`): whether the examples say which of their tokens carry the
            loss (`data.has_replies`), so that the check also compares the replies.
    Returns:
        `tuple[float | None, str]`: `"auto"` threshold → `AUTO_NEAR_DUPLICATE_THRESHOLD` where the check can run,
        for a classification head, and for a language model whose examples give their replies; else `None`;
        `"auto"` weight → `"one"` when that auto threshold is on, else `"group"`.
    """
    auto_on = token_check and (not token_level or replies)
    threshold = settings.near_duplicate_threshold
    if threshold == AUTO:
        threshold = AUTO_NEAR_DUPLICATE_THRESHOLD if auto_on else None
        weight = "one" if auto_on else "group"
    else:
        weight = "group"
    if settings.duplicate_weight != AUTO:
        weight = settings.duplicate_weight
    return threshold, weight


# `noise_share="auto"` for a classification head unless the pool looks noisy (`NOISY_POOL_RATE`), measured on 20
# Newsgroups (clean, 40 % wrong labels, 60 % duplicated rows) and skill classification (benchmarks/README.md)
AUTO_NOISE_SHARE = 0.2


def resolve_noise_share(settings: SelectionSettings, *, available: bool) -> float:
    """`settings.noise_share` with `"auto"` resolved before the feature pass: `AUTO_NOISE_SHARE` where `available`
    (the trainer's rule, `pipeline.resolved_auto_settings`: a built-in feature, no target set, not sharded; the
    feature pass then reads the pool's noise, `noise_filter.with_noise_filter`: for a classification head an
    estimate of `NOISY_POOL_RATE` or more replaces the share, for a language model the share stays only when
    `reply_disagreement` is `NOISY_REPLY_SHARE` or more), else 0.0; a number given explicitly is kept."""
    if settings.noise_share == AUTO:
        return AUTO_NOISE_SHARE if available else 0.0
    return float(settings.noise_share)


# A pool whose noise filter estimates a noise rate of at least this looks noisy: `noise_share="auto"` defers the
# estimate and `reset_optimizer_state="auto"` clears Adam's state. Between the clean pools (20 Newsgroups 0.10-0.12,
# skill classification 0.21-0.24) and 20 Newsgroups with 40 % wrong labels (0.36-0.38) (benchmarks/README.md)
NOISY_POOL_RATE = 0.3
MAX_AUTO_SHARE = 0.5  # "auto" defers at most half of every cluster
# A language model's pool looks noisy when at least this share of its replies disagree with their prompt neighbours'
# (`noise_filter.reply_disagreement`): then `noise_share="auto"` defers `AUTO_NOISE_SHARE` of every cluster, else
# none. Between clean MathQA (0.04-0.07) and Natural-Instructions with 40 % of replies swapped (0.125-0.135)
# (benchmarks/README.md)
NOISY_REPLY_SHARE = 0.1


def resolve_reset_optimizer_state(setting: bool | str, clustering_params: dict | None) -> bool:
    """`reset_optimizer_state` as a bool: `"auto"` is on when `clustering_params["noise_rate_estimate"]` (the noise
    filter's estimate, fraction 0–1; absent when it did not estimate) is at least `NOISY_POOL_RATE`.

    Raises:
        TypeError: if `setting` is neither a bool nor `"auto"`.
    """
    if is_auto_bool("reset_optimizer_state", setting):
        return float((clustering_params or {}).get("noise_rate_estimate") or 0.0) >= NOISY_POOL_RATE
    return setting


@dataclass(frozen=True)
class TargetSettings:
    """Settings of targeted selection (used when the run has a target set: `ClusterTrainer(target_dataset=...)` or
    `ClusterSelectConfig(target="eval")`).

    Attributes:
        target_rule (`str`, defaults to `"top_k_cosine"`): how each target task ranks the pool
            (`registry.TARGET_RULES`): `"top_k_cosine"` the examples most similar to the task (RDS+; chosen on
            benchmarks/targeted.py and targeted_probe.py, where it tied or beat the alternatives),
            `"relevant_sample"` a seeded random sample of the task's relevant region (pool examples at least as
            close to the task as its target examples are to each other; mixed against top-k, not the default),
            `"cluster_relevance"` the clusters nearest to the task first (mean relevance of their members).
        target_coverage (`float`, defaults to `0.0`): share of the budget, in [0, 1), spread over every cluster in
            proportion to its size (the most relevant members of each) before the target tasks get the rest;
            0 = everything follows the target.
        target_column (`str`, *optional*): a column of the target set naming its target tasks; each task gets an
            equal share of the budget (round-robin, RDS+); `None` = the target set is one task.
    Raises:
        ValueError: for an unknown rule, a coverage outside [0, 1) or an empty column name.
    """

    target_rule: str = field(default="top_k_cosine", metadata={
        "help": "How each target task ranks the pool (registry.TARGET_RULES): 'top_k_cosine' = the examples most "
                "similar to it (RDS+); 'relevant_sample' = a random sample of the examples as close to it as its "
                "own examples are to each other; 'cluster_relevance' = the clusters nearest to it first."})
    target_coverage: float = field(default=0.0, metadata={
        "help": "Share of the budget, in [0, 1), spread over every cluster in proportion to its size (the most "
                "relevant members of each); the target tasks get the rest. 0 = everything follows the target."})
    target_column: str | None = field(default=None, metadata={
        "help": "A column of the target set naming its target tasks; each gets an equal share of the budget "
                "(round-robin); None = one task."})

    def __post_init__(self) -> None:
        from .registry import TARGET_RULES  # registry imports this module

        TARGET_RULES.get(self.target_rule)
        value = self.target_coverage
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"`target_coverage` must be a float in [0, 1), got {value!r}.")
        object.__setattr__(self, "target_coverage", float(value))
        if self.target_column is not None and (not isinstance(self.target_column, str) or not self.target_column):
            raise ValueError(f"`target_column` must be a column name or None, got {self.target_column!r}.")
