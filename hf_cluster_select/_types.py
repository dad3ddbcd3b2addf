"""Frozen result types passed between pipeline stages (layer L0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Raw labels of examples kept out of clustering (HDBSCAN noise is -1). See `clustering.cluster_features`.
NONFINITE_LABEL = -2  # the feature row held NaN/inf (e.g. an fp16 overflow)
NO_LOSS_LABEL = -3  # the example has no loss-bearing token (every label -100), so its feature is meaningless


@dataclass(frozen=True)
class ClusteringResult:
    """Output of `clustering.cluster_features`.

    Attributes:
        labels (`np.ndarray` of shape `[n_examples]`, int64): cluster of every example after the noise policy,
            in `0..n_clusters-1` (no -1 left).
        raw_labels (`np.ndarray` of shape `[n_examples]`, int64): the clusterer's own labels, -1 = HDBSCAN noise,
            `NONFINITE_LABEL` (-2) = non-finite feature row, `NO_LOSS_LABEL` (-3) = no loss-bearing token (both kept
            out of clustering).
        reduced (`np.ndarray` of shape `[n_examples, reduced_dim]`, float32): the L2-normalised, PCA-reduced
            features the clusterer saw (used for centroid distances in selection).
        n_clusters (`int`): number of distinct values in `labels`.
        method (`str`): the clusterer that produced `labels` (`"hdbscan"`, `"kmeans"`, ...).
        fallback (`str` or `None`): why and how a degenerate result was repaired (e.g. all noise → one cluster),
            `None` when the clusterer's result was used as is.
        params (`dict`): the resolved parameters (min_cluster_size, min_samples, pca_dim, ...).
        groups (`np.ndarray` of shape `[n_examples]`, int64, *optional*): duplicate groups — examples with identical
            (L2-normalised, float32) features share an id, and, with `near_duplicate_threshold`, so do examples whose
            tokens are near copies (joined in by `pipeline.with_near_duplicates`); selection keeps at most one copy of
            a group while it can (`select.select_from_labels`, `groups`).
    """

    labels: np.ndarray
    raw_labels: np.ndarray
    reduced: np.ndarray
    n_clusters: int
    method: str
    fallback: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    groups: np.ndarray | None = None

    @property
    def n_noise(self) -> int:
        """Number of examples the clusterer labelled noise (-1)."""
        return int((self.raw_labels == -1).sum())

    @property
    def n_nonfinite(self) -> int:
        """Number of examples whose feature row held NaN/inf (kept out of clustering, never dropped)."""
        return int((self.raw_labels == NONFINITE_LABEL).sum())

    @property
    def n_no_loss(self) -> int:
        """Number of examples without any loss-bearing token (kept out of clustering, selected last)."""
        return int((self.raw_labels == NO_LOSS_LABEL).sum())


@dataclass(frozen=True)
class Selection:
    """Output of `selection.select_subset`.

    Attributes:
        indices (`np.ndarray` of shape `[n_kept]`, int64): kept dataset indices, sorted ascending, unique.
        weights (`np.ndarray` of shape `[n_kept]`, float64): per-example weights (`|C_c| / kept_c` for the uniform
            rules; the within-cluster rule's otherwise); they sum to `n_total` so that the weighted kept set stands
            for the full data.
        labels (`np.ndarray` of shape `[n_kept]`, int64): cluster of each kept example.
        n_total (`int`): number of examples selection chose from.
        stage_seconds (`dict` of `str` to `float`): wall-clock seconds of the choosing stages of
            `select.select_from_labels` — `inputs` (checking the arguments), `units` (duplicate groups to candidates), `quotas` (the budget split over
            clusters), `within_cluster` (the rule in every cluster), `weights` (rescaling and sorting); empty for a
            selection made otherwise (loaded from disk, a target's). Not compared by `==`.
    """

    indices: np.ndarray
    weights: np.ndarray
    labels: np.ndarray
    n_total: int
    stage_seconds: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def n_kept(self) -> int:
        """Number of kept examples."""
        return int(self.indices.shape[0])

    @property
    def fraction(self) -> float:
        """Kept examples / all examples, in (0, 1]."""
        return self.n_kept / self.n_total if self.n_total else 0.0

    def loss_weights(self) -> np.ndarray:
        """Weights rescaled to mean 1 over the kept set (`weights · n_kept / n_total`), shape `[n_kept]`.

        These multiply the per-example loss during training: the optimizer sees the same loss scale as with
        unweighted data (so the learning rate keeps its meaning) while the kept set keeps the full-data mixture.
        """
        return self.weights * (self.n_kept / self.n_total)


@dataclass(frozen=True)
class RunFacts:
    """What a run resolves once, before any model work (`run.resolve_run_facts`, called by `ClusterTrainer.plan()`
    and the `select` command), and every later stage reads instead of deciding again.

    Attributes:
        shift_labels (`bool`): whether position `t` predicts `labels[t + 1]` (causal LM); features, checks and the
            weighted loss all follow it.
        feature (`str`): the registered signal computed (`feature="auto"` resolved for the model).
        feature_layers (`int` or `None`): transformer blocks the feature pass really runs (`None` = all).
        feature_used (`str`): the feature as the report and card state it (`"hidden_mean after 20 blocks"`).
        feature_autocast (`bool` or `None`): the feature pass's bf16 autocast (`feature_precision`: True = bf16,
            False = fp32, None = bf16 on CUDA only).
        loss_weighted (`bool`): whether training losses can carry weights other than 1 (`data_fraction` < 1, or an
            allocation that re-weights even the full data, CluSTER's): then every loss path must apply them.
        strata (`tuple` of length `n_examples` or `None`): the `stratify_column` value of every example.
        token_digest (`str` or `None`): `data.token_digest` of the training data (part of the data fingerprint).
        model_config (`dict` or `None`): `feature_cache.model_config_dict` of the trained model (resume checks).
        n_dropped_by_preparation (`int` or `None`): examples the trainer's data preparation dropped before
            selection (TRL: no loss-bearing token after truncation); `None` = no such step.
        duplicates (`dict` or `None`): `near_duplicate_threshold`, `duplicate_weight` and `noise_share` with `"auto"`
            resolved for the model and feature (`pipeline.resolved_auto_settings`); `select_with_model` selects with
            them (`None`: it resolves them itself), and a resumed run compares them with the checkpoint's.
    """

    shift_labels: bool
    feature: str
    feature_layers: int | None
    feature_used: str
    loss_weighted: bool
    strata: tuple | None = None
    token_digest: str | None = None
    model_config: dict | None = None
    n_dropped_by_preparation: int | None = None
    feature_autocast: bool | None = None
    duplicates: dict | None = None


@dataclass(frozen=True)
class TargetSet:
    """A target set as the feature pass reads it (built by the trainer or the `select` command, checked there).

    Attributes:
        dataset (map-style dataset of `dict`): the target examples in the training data's format (the trainer's
            feature view: tokenized, with `labels`).
        lengths (`tuple` of `int`, length `n_target`): tokens of every target example.
        tasks (`np.ndarray` of shape `[n_target]`, int64): target task of every example, `0..n_tasks-1`.
        task_names (`tuple` of `str`, length `n_tasks`): the tasks' names (values of `target_column`, or the keys
            of a dict of eval datasets; `("target",)` for one task).
        source (`str`): where it came from, for the report (`"target_dataset"`, `"eval_dataset"`, a file path).
        fingerprint (`str`): `persistence.data_fingerprint` of its tokens (the feature-cache identity of its
            features).
    """

    dataset: Any
    lengths: tuple
    tasks: np.ndarray
    task_names: tuple
    source: str
    fingerprint: str

    @property
    def n_tasks(self) -> int:
        """Number of target tasks."""
        return len(self.task_names)
