"""The measured record of one data selection (layer L2: imports only config/_types, numpy and the standard library).

`SelectionReport` holds what the caller measured — counts, per-example assignments, timings, step counts — and the
comparison against full-data training computed by `estimate_savings`. It round-trips through JSON and is the one
source the model card section (`model_card.py`) and the plots (`plots.py`) are drawn from.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._types import ClusteringResult, Selection
from ..atomic import atomic_open
from ..config import ClusterSelectConfig
from .savings import MEASURED, estimate_savings

TOKEN_KINDS = ("loss", "input")
_FLOAT_FIELDS = (
    "warmup_seconds", "features_seconds", "near_duplicates_seconds", "clustering_seconds", "selection_seconds",
    "training_seconds", "total_seconds", "full_data_seconds", "seconds_saved", "fraction_saved", "fraction_kept",
    "fraction_tokens_kept", "padded_tokens_per_batch_full", "padded_tokens_per_batch_selected",
)
_METRIC_FIELDS = (
    "n_examples", "n_kept", "fraction_kept", "tokens_total", "tokens_kept", "fraction_tokens_kept", "n_clusters",
    "n_noise", "n_nonfinite_features", "n_no_loss_tokens", "n_near_duplicate_rows", "n_suspected_noise",
    "warmup_steps", "selected_steps", "full_data_steps", "warmup_seconds", "features_seconds",
    "near_duplicates_seconds", "clustering_seconds", "selection_seconds", "training_seconds", "total_seconds",
    "full_data_seconds", "seconds_saved", "fraction_saved",
)


def _plain(value: Any) -> Any:
    """Numpy scalars/arrays (also nested in lists/dicts) → plain Python, so that the report is JSON as-is."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass
class SelectionReport:
    """What one selection did and cost, as measured by the caller. Every field is plain JSON.

    Attributes:
        n_examples (`int`): examples in the full training set. n_kept (`int`): examples kept.
        n_dropped_by_preparation (`int` or `None`): examples the trainer's data preparation removed before selection
            because no token carried loss (TRL's SFTTrainer after truncation to `max_length`); not counted in
            `n_examples`. `None` = no such preparation step (plain `ClusterTrainer`).
        fraction_kept (`float`, 0–1): n_kept / n_examples; computed when left `None`.
        tokens_total, tokens_kept (`int` or `None`): tokens of kind `token_kind` in all / kept examples.
        fraction_tokens_kept (`float`, 0–1, or `None`): tokens_kept / tokens_total; computed when left `None`.
        token_kind (`str`): `"loss"` = loss-bearing tokens (labels ≠ -100), `"input"` = all input tokens.
        n_clusters (`int`): clusters after the noise policy. n_noise (`int`): raw HDBSCAN noise (-1) count.
        n_nonfinite_features (`int`): examples whose features held NaN/inf, kept out of clustering in a group of
            their own (never dropped). n_no_loss_tokens (`int`): examples without any loss-bearing token, kept out of
            clustering and selected only when the budget needs them.
        n_near_duplicate_rows (`int` or `None`): examples the token near-duplicate check
            (`SelectionSettings.near_duplicate_threshold`) put into an earlier example's group; `None` = not run.
        n_suspected_noise (`int` or `None`): examples the noise filter (`SelectionSettings.noise_share`) deferred as
            suspected label/reply noise; `None` = not run.
        cluster_sizes (`list[int]` of length `n_clusters`): full-data size of each cluster.
        kept_per_cluster (`list[int]` of length `n_clusters`): kept examples of each cluster.
        clustering_method (`str`), fallback (`str` or `None`), clustering_params (`dict`): as in `ClusteringResult`.
        config (`dict`): `ClusterSelectConfig.to_dict()`.
        world_size, per_device_train_batch_size, gradient_accumulation_steps (`int`): the batch geometry.
        labels (`list[int]` of length `n_examples`): assigned cluster per example. raw_labels: clusterer's own
            label per example (-1 = noise). kept_indices (`list[int]`, sorted): kept dataset indices.
        weights (`list[float]` of length `n_kept`): per-example weights, summing to `n_examples`.
        warmup_seconds, features_seconds, clustering_seconds, selection_seconds (features + near-duplicate check +
            clustering + choosing), training_seconds (post-selection), total_seconds (`float` seconds or `None` = not
            measured yet).
        near_duplicates_seconds (`float` or `None`): seconds of the token near-duplicate check; `None` = not run.
        stage_seconds (`dict` of `str` to `float`, or `None`): wall-clock seconds of the stages of clustering and
            choosing (`clustering_seconds` split): `screen`, `dedup`, `pca`, `fit`, `assign` (when the clusterer
            places rows outside its fit), `outputs` (`ClusteringResult.params["stage_seconds"]`), then `inputs`,
            `units`, `quotas`, `within_cluster`, `weights` (`Selection.stage_seconds`; not for a target's
            selection, which is chosen otherwise); `None` = not measured (a selection reused or loaded from disk).
        warmup_steps, selected_steps, full_data_steps (`int` optimizer steps or `None`).
        full_data_seconds (`float` seconds or `None`) and full_data_seconds_basis (`str` or `None`): the full-data
            time compared against and whether it was measured or estimated (see `estimate_savings`).
        seconds_saved (`float` seconds), fraction_saved (`float`, share of full_data_seconds), or `None`.
        input_tokens_total, input_tokens_kept (`int` or `None`): all input tokens (prompt included) of all / kept
            examples.
        padded_tokens_per_batch_full, padded_tokens_per_batch_selected (`float` or `None`): mean padded tokens of a
            stock-sampler batch of the full data (simulated) and of a batch of this run's subset plan
            (`batching/padding.py`): what a step costs; their ratio scales the estimated full-data time.
        features_from_cache (`bool` or `None`): whether the features were loaded from the feature cache
            (`feature_cache.py`; then `features_seconds` is the load time) instead of computed; `None` = no features.
        feature_used (`str` or `None`): the feature computed, `feature="auto"` resolved for the model
            (`features/choice.py`), e.g. `"hidden_mean after 20 blocks"`; `None` = no features.
        feature_map (`dict` or `None`): 2-D PCA coordinates of a sample of the features (`feature_map.py`).
        eval_metrics (`dict` or `None`): the run's latest `eval_*` metrics (`Trainer.evaluate`) and `step`, copied
            from the Trainer's log history when the card is written.
        target (`dict` or `None`): with a target set (`selection.targeted`), what targeted selection did: `source`,
            `task_names`, `n_target_per_task` (target examples per task), `kept_per_task` (budget each task's
            round-robin turns took), `coverage_kept` (the coverage floor's examples), `cluster_relevance` (cluster →
            mean max-cosine relevance of its members to the nearest task), `mean_relevance_kept` /
            `mean_relevance_pool`, `target_rule`, `target_coverage`, `self_relevance` (per task, the relevant region's
            threshold, `selection.target_self_relevance`; `None` for a one-example task), `features_from_cache`;
            `None` = untargeted.
        batch_order (`str` or `None`): the order the subset's batches follow over each epoch, `"shuffled"` or
            `"easy_to_hard"` (`ClusterSelectConfig.order`, `batching/curriculum.py`); `None` = no training run.
        batch_order_fallback (`str` or `None`): why `order="easy_to_hard"` trained `"shuffled"` (no per-example
            loss); `None` when the order asked for was used.
    """

    n_examples: int
    n_kept: int
    fraction_kept: float | None = None
    tokens_total: int | None = None
    tokens_kept: int | None = None
    fraction_tokens_kept: float | None = None
    token_kind: str = "loss"
    n_clusters: int = 0
    n_noise: int = 0
    n_nonfinite_features: int = 0
    n_no_loss_tokens: int = 0
    n_near_duplicate_rows: int | None = None
    n_suspected_noise: int | None = None
    cluster_sizes: list[int] = field(default_factory=list)
    kept_per_cluster: list[int] = field(default_factory=list)
    clustering_method: str = ""
    fallback: str | None = None
    clustering_params: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    labels: list[int] = field(default_factory=list)
    raw_labels: list[int] = field(default_factory=list)
    kept_indices: list[int] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    warmup_seconds: float | None = None
    features_seconds: float | None = None
    clustering_seconds: float | None = None
    selection_seconds: float | None = None
    training_seconds: float | None = None
    total_seconds: float | None = None
    near_duplicates_seconds: float | None = None
    warmup_steps: int | None = None
    selected_steps: int | None = None
    full_data_steps: int | None = None
    full_data_seconds: float | None = None
    full_data_seconds_basis: str | None = None
    seconds_saved: float | None = None
    fraction_saved: float | None = None
    n_dropped_by_preparation: int | None = None
    input_tokens_total: int | None = None
    input_tokens_kept: int | None = None
    padded_tokens_per_batch_full: float | None = None
    padded_tokens_per_batch_selected: float | None = None
    features_from_cache: bool | None = None
    feature_used: str | None = None
    feature_map: dict | None = None
    eval_metrics: dict | None = None
    target: dict | None = None
    batch_order: str | None = None
    batch_order_fallback: str | None = None
    stage_seconds: dict[str, float] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, _plain(getattr(self, f.name)))
        if self.n_examples < 0 or not 0 <= self.n_kept <= max(self.n_examples, 0):
            raise ValueError(f"`n_kept` must be in [0, n_examples={self.n_examples}], got {self.n_kept}.")
        if self.fraction_kept is None:
            self.fraction_kept = self.n_kept / self.n_examples if self.n_examples else 0.0
        if self.fraction_tokens_kept is None and self.tokens_total and self.tokens_kept is not None:
            self.fraction_tokens_kept = self.tokens_kept / self.tokens_total
        if self.token_kind not in TOKEN_KINDS:
            raise ValueError(f"`token_kind` must be one of {list(TOKEN_KINDS)}, got {self.token_kind!r}.")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                if not math.isfinite(float(value)):
                    raise ValueError(f"`{name}` must be finite or None, got {value!r}.")
                setattr(self, name, float(value))
        for name, length in (("labels", self.n_examples), ("raw_labels", self.n_examples),
                             ("kept_indices", self.n_kept), ("weights", self.n_kept)):
            if getattr(self, name) and len(getattr(self, name)) != length:
                raise ValueError(f"`{name}` must be empty or have length {length}, got {len(getattr(self, name))}.")
        for name in ("cluster_sizes", "kept_per_cluster"):
            if getattr(self, name) and len(getattr(self, name)) != self.n_clusters:
                raise ValueError(f"`{name}` must be empty or have length n_clusters={self.n_clusters}, "
                                 f"got {len(getattr(self, name))}.")

    @classmethod
    def build(cls, clustering: ClusteringResult, selection: Selection, config: ClusterSelectConfig, *,
              lengths: Any, loss_tokens: Any = None, plan: Any = None, clock: Any = None,
              **measured: Any) -> "SelectionReport":
        """The report of one selection, built once, from the outcome, the step plan and the clock.

        Args:
            clustering (`ClusteringResult`): labels `[n_examples]` and raw labels of the full data (`reduced` is
                not read).
            selection (`Selection`): kept indices and weights `[n_kept]`.
            config (`ClusterSelectConfig`): the configuration that produced them.
            lengths (array-like of shape `[n_examples]`, int): input tokens of every example.
            loss_tokens (array-like of shape `[n_examples]`, int, *optional*): loss-bearing tokens of every example
                (counted by the feature pass); without them the token counts are input tokens (`token_kind`).
            plan (`StepPlan`, *optional*): the run's step plan (batch geometry, warm-up, selected and full-data
                steps); `None` for a selection outside training (the `select` command): steps stay `None`.
            clock (`PhaseClock`, *optional*): its `warmup`, `features`, `near_duplicates` and `clustering` phases
                give the seconds.
            **measured: the remaining fields (`features_from_cache`, `feature_used`, `feature_map`,
                `n_dropped_by_preparation`, `target`, `batch_order`, `batch_order_fallback`), or ones to state
                instead of the plan's or the clock's.
        Raises:
            ValueError: for a field out of range (see `__post_init__`).
        """
        labels = np.asarray(clustering.labels, dtype=np.int64)
        n_clusters = int(clustering.n_clusters)
        lengths = np.asarray(lengths, dtype=np.int64)
        counted = lengths if loss_tokens is None else np.asarray(loss_tokens, dtype=np.int64)
        fields: dict[str, Any] = dict(
            tokens_total=int(counted.sum()), tokens_kept=int(counted[selection.indices].sum()),
            token_kind="input" if loss_tokens is None else "loss", input_tokens_total=int(lengths.sum()),
            input_tokens_kept=int(lengths[selection.indices].sum()))
        if plan is not None:
            fields.update(world_size=plan.world_size, per_device_train_batch_size=plan.per_device_batch_size,
                          gradient_accumulation_steps=plan.gradient_accumulation_steps, warmup_steps=plan.warmup_steps,
                          selected_steps=plan.selected_steps, full_data_steps=plan.full_data_steps)
        if clock is not None:
            seconds = {phase: clock.measured(phase) for phase in ("warmup", "features", "near_duplicates",
                                                                  "clustering")}
            fields.update(warmup_seconds=seconds["warmup"], features_seconds=seconds["features"],
                          near_duplicates_seconds=seconds["near_duplicates"], clustering_seconds=seconds["clustering"],
                          selection_seconds=sum(seconds[p] or 0.0 for p in ("features", "near_duplicates",
                                                                             "clustering")))
        return cls(
            n_examples=int(labels.shape[0]), n_kept=selection.n_kept, n_clusters=n_clusters,
            n_noise=clustering.n_noise, n_nonfinite_features=clustering.n_nonfinite,
            n_no_loss_tokens=clustering.n_no_loss,
            n_near_duplicate_rows=clustering.params.get("n_near_duplicate_rows"),
            n_suspected_noise=clustering.params.get("n_suspected_noise"),
            cluster_sizes=np.bincount(labels, minlength=n_clusters).tolist(),
            kept_per_cluster=np.bincount(np.asarray(selection.labels, dtype=np.int64), minlength=n_clusters).tolist(),
            clustering_method=clustering.method, fallback=clustering.fallback,
            clustering_params={k: v for k, v in clustering.params.items() if k != "stage_seconds"},
            stage_seconds={**clustering.params.get("stage_seconds", {}), **selection.stage_seconds} or None,
            config=config.to_dict(),
            labels=labels, raw_labels=np.asarray(clustering.raw_labels), kept_indices=np.asarray(selection.indices),
            weights=np.asarray(selection.weights, dtype=np.float64), **{**fields, **measured},
        )

    def for_reuse(self, plan: Any) -> "SelectionReport":
        """This report for a run that trains on the same selection without making it (`ClusterTrainer(selection=
        ...)`): no warm-up, feature pass or clustering paid (0 seconds, 0 warm-up steps), the new run's selected
        steps, and nothing measured about training yet."""
        return dataclasses.replace(
            self, warmup_seconds=0.0, features_seconds=0.0, clustering_seconds=0.0, selection_seconds=0.0,
            near_duplicates_seconds=None if self.near_duplicates_seconds is None else 0.0, stage_seconds=None,
            warmup_steps=0, selected_steps=plan.selected_steps, full_data_steps=plan.full_data_steps,
            training_seconds=None, total_seconds=None, full_data_seconds=None, full_data_seconds_basis=None,
            seconds_saved=None, fraction_saved=None)

    def finalize(self, clock: Any, *, padded_tokens_per_batch_full: float | None = None,
                 padded_tokens_per_batch_selected: float | None = None,
                 measured_full_seconds: float | None = None) -> "SelectionReport":
        """Fill, at the end of training, the warm-up and training seconds from the clock, the padded tokens per
        batch, and the savings (`apply_savings`: measured with `measured_full_seconds`, else estimated). Returns
        this report."""
        self.warmup_seconds = clock.measured("warmup") or 0.0
        self.training_seconds = clock.measured("training") or 0.0
        if padded_tokens_per_batch_full is not None:
            self.padded_tokens_per_batch_full = float(padded_tokens_per_batch_full)
            self.padded_tokens_per_batch_selected = float(padded_tokens_per_batch_selected)
        self.total_seconds = None
        self.apply_savings(measured_full_seconds)
        return self

    def apply_savings(self, measured_full_seconds: float | None = None) -> dict[str, Any]:
        """Fill `full_data_seconds`, its basis, `seconds_saved`, `fraction_saved` (and `total_seconds` when unset)
        from this report's timings and steps with `estimate_savings`; missing warm-up time/steps count as 0.

        Raises:
            ValueError: if `selection_seconds`, `training_seconds`, `selected_steps` or `full_data_steps` is None,
                or `warmup_steps` > 0 with `warmup_seconds` None.
        """
        for name in ("selection_seconds", "training_seconds", "selected_steps", "full_data_steps"):
            if getattr(self, name) is None:
                raise ValueError(f"`{name}` must be measured before savings can be computed.")
        if self.warmup_steps and self.warmup_seconds is None:
            raise ValueError("`warmup_seconds` must be measured when `warmup_steps` > 0.")
        out = estimate_savings(
            warmup_seconds=self.warmup_seconds or 0.0, warmup_steps=self.warmup_steps or 0,
            selected_steps=self.selected_steps, full_data_steps=self.full_data_steps,
            selection_seconds=self.selection_seconds, training_seconds=self.training_seconds,
            measured_full_seconds=measured_full_seconds, length_ratio=self.length_ratio(),
        )
        self.full_data_seconds = out["full_data_seconds"]
        self.full_data_seconds_basis = out["full_data_seconds_basis"]
        self.seconds_saved, self.fraction_saved = out["seconds_saved"], out["fraction_saved"]
        if self.total_seconds is None:
            self.total_seconds = out["our_seconds"]
        return out

    def length_ratio(self) -> float | None:
        """Padded tokens of a stock full-data batch over those of a batch of the subset plan; without them, mean
        input tokens per example of the full data over the kept set's; `None` when neither was counted."""
        if self.padded_tokens_per_batch_full and self.padded_tokens_per_batch_selected:
            return self.padded_tokens_per_batch_full / self.padded_tokens_per_batch_selected
        if not (self.input_tokens_total and self.input_tokens_kept and self.n_kept and self.n_examples):
            return None
        return (self.input_tokens_total / self.n_examples) / (self.input_tokens_kept / self.n_kept)

    def summary_metrics(self) -> dict[str, float]:
        """Scalar figures for `Trainer.log`, keys prefixed `cluster_select/`; fields still `None` are left out. When
        the full-data time is estimated, its three figures are logged as `cluster_select/full_data_seconds_estimated`,
        `seconds_saved_estimated` and `fraction_saved_estimated`, and as `..._measured` when it was measured, so no
        dashboard shows an estimate as a measurement."""
        metrics = {
            f"cluster_select/{name}": float(getattr(self, name))
            for name in _METRIC_FIELDS
            if getattr(self, name) is not None
        }
        if self.full_data_seconds_basis is not None:
            suffix = "_measured" if self.full_data_seconds_basis == MEASURED else "_estimated"
            for name in ("full_data_seconds", "seconds_saved", "fraction_saved"):
                if f"cluster_select/{name}" in metrics:
                    metrics[f"cluster_select/{name}{suffix}"] = metrics.pop(f"cluster_select/{name}")
        return metrics

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SelectionReport":
        """Inverse of `to_dict`.

        Raises:
            ValueError: if `values` holds a key that is not a field of this class.
        """
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"`values` has keys that are not SelectionReport fields: {unknown}.")
        return cls(**values)

    def to_json(self) -> str:
        """JSON text of `to_dict()` (strict JSON: no NaN/inf)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "SelectionReport":
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike) -> str:
        """Write `to_json()` to `path` atomically (temporary file in the same folder, then `os.replace`).

        Returns:
            `str`: the path written.
        """
        path = os.fspath(path)
        with atomic_open(path, "w") as handle:
            handle.write(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SelectionReport":
        """Read a report written by `save`."""
        with open(path, encoding="utf-8") as handle:
            return cls.from_json(handle.read())
