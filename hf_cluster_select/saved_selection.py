"""What a saved selection is, and the checks before a run trusts one (layer L2).

`SavedSelection` is what `persistence.load_selection` reads from a checkpoint's `cluster_selection.npz` (or what
`ClusterTrainer(selection=...)` is given). Nothing on disk is trusted: `validate_saved_selection` checks what the
file alone can tell (indices, weights, labels, config), and `check_saved_against` whether it belongs to the run about
to adopt it (the same data, target set, selection settings and model); `config_differences` names the settings that
differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._types import Selection
from .config import ClusterSelectConfig
from .settings import AUTO, SelectionSettings


# Config fields that do not change which examples are selected or their weights (batching only: a resumed run may
# change them, and trains its remaining batches in the new setting's plan).
NOT_SELECTION_FIELDS = frozenset({"balance_tokens", "balance_window", "feature_batch_size", "order",
                                  "reset_optimizer_state"})


# Settings whose "auto" is resolved per model when the selection runs (`pipeline.resolved_auto_settings`); the report's
# `clustering_params` records the values.
RESOLVED_PER_MODEL = ("near_duplicate_threshold", "duplicate_weight", "noise_share")


def _resolved(values: dict) -> dict:
    """`ClusterSelectConfig.resolved()` of a `to_dict()`; where it does not build (a strategy not registered in
    this process), its fields with `strategy_kwargs` flattened in."""
    try:
        return ClusterSelectConfig.from_dict(values).resolved()
    except (ValueError, TypeError):
        flat = dict(values)
        flat.update(flat.pop("strategy_kwargs", None) or {})
        return flat


def config_differences(saved: dict, current: dict, ignore: tuple[str, ...] = (), saved_resolved: dict | None = None,
                       current_resolved: dict | None = None) -> list[str]:
    """`field: saved in the checkpoint, current now` for every selection-relevant `ClusterSelectConfig` field or
    strategy setting (`ClusterSelectConfig.resolved()`) that differs (fields missing on one side, from another
    version, and the fields in `ignore` are skipped). The settings resolved per model (`RESOLVED_PER_MODEL`) are
    compared as their `"auto"` resolved: the saved run's as its report recorded them (`saved_resolved`, its
    `clustering_params`), the current run's for its model (`current_resolved`, `RunFacts.duplicates`); as given
    when either is unknown (a checkpoint of an older version)."""
    saved, current = _resolved(saved), _resolved(current)
    for name in set(saved_resolved or {}) & set(current_resolved or {}) & set(RESOLVED_PER_MODEL):
        saved[name], current[name] = saved_resolved[name], current_resolved[name]
    skip = NOT_SELECTION_FIELDS | set(ignore)
    return [f"{name}: {saved[name]!r} in the checkpoint, {current[name]!r} now"
            for name in sorted(set(saved) & set(current)) if name not in skip and saved[name] != current[name]]


@dataclass(frozen=True)
class SavedSelection:
    """What `load_selection` returns.

    Attributes:
        selection (`Selection`): kept indices, weights and kept labels.
        labels (`np.ndarray` of shape `[n_examples]`): cluster of every example.
        raw_labels (`np.ndarray` of shape `[n_examples]`): clusterer label of every example (-1 = noise).
        config (`dict`): `ClusterSelectConfig.to_dict()` of the run that selected.
        fingerprint (`str`): `data_fingerprint` of the data it was selected from.
        extra (`dict`): measured figures (seconds, counts) stored with it.
        path (`str` or `None`): the file it was read from (`None` when built in memory); errors name it.
        difficulty (`np.ndarray` of shape `[n_kept]`, float, or `None`): feature-pass loss of each kept example (the
            curriculum order's, `batching/curriculum.py`); `None` when not stored (older versions, no losses).
    """

    selection: Selection
    labels: np.ndarray
    raw_labels: np.ndarray
    config: dict
    fingerprint: str
    extra: dict
    path: str | None = None
    difficulty: np.ndarray | None = None


def _first(mask: np.ndarray, what: str, values: np.ndarray | None = None) -> str:
    """`1 is NaN (position 3)` / `2 are <= 0 (first at position 0: -50.0)` for the `True` entries of `mask`."""
    positions = np.flatnonzero(mask)
    value = "" if values is None else f": {values[positions[0]].item()!r}"
    if positions.size == 1:
        return f"1 is {what} (position {positions[0]}{value})"
    return f"{positions.size} are {what} (first at position {positions[0]}{value})"


def _array(value, field: str, length: int | None, length_name: str, fail, kind=np.integer) -> np.ndarray:
    """`value` as a checked 1-D array of `kind` (integers, or `np.floating`) and `length` entries (when given)."""
    if value is None:
        fail(field, "is missing")
    array = np.asarray(value)
    if array.ndim != 1:
        fail(field, f"must be a 1-D array; found shape {array.shape}")
    if not np.issubdtype(array.dtype, kind):
        fail(field, f"must hold {'integers' if kind is np.integer else 'floats'}; found dtype {array.dtype}")
    if length is not None and array.size != length:
        fail(field, f"must hold {length_name} = {length} entries; found {array.size}")
    return array


def validate_saved_selection(saved: SavedSelection, path: str | None = None, n_examples: int | None = None) -> None:
    """Check a saved selection before anything trains on it: what the file alone can tell, and with `n_examples`
    that it was made for a dataset of that size.

    Checked: `n_total` an int >= 1; `indices` `[n_kept]` integers, non-empty, in `[0, n_total)`, unique, sorted
    ascending; `weights` `[n_kept]` floats, finite, > 0, summing to `n_total` within a relative 1e-6 (the weighted
    kept set stands for the full data); `kept_labels` `[n_kept]` integers >= 0; `labels` and `raw_labels`
    `[n_total]` integers; `difficulty`, when stored, `[n_kept]` floats (NaN allowed: sorts last); `config` a dict
    that `ClusterSelectConfig.from_dict` accepts; `fingerprint` a non-empty str; `extra` (and its `report`,
    `model_config`) a dict.

    Args:
        saved (`SavedSelection`): what `load_selection` read, or one built in memory.
        path (`str`, *optional*): the file, named in errors (defaults to `saved.path`).
        n_examples (`int`, *optional*): the size of the training data it is about to be used on.
    Raises:
        ValueError: `"<path>: `<field>` must …; found …"`, for the first check that fails.
    """
    where = path or saved.path or "the given selection (SavedSelection)"

    def fail(field: str, message: str):
        raise ValueError(f"{where}: `{field}` {message}.")

    selection = saved.selection
    n_total = selection.n_total
    if isinstance(n_total, bool) or not isinstance(n_total, (int, np.integer)) or n_total < 1:
        fail("n_total", "is missing" if n_total is None else f"must be an int >= 1; found {n_total!r}")
    n_total = int(n_total)
    indices = _array(selection.indices, "indices", None, "", fail)
    n_kept = indices.size
    if n_kept == 0:
        fail("indices", "must hold at least one kept example; found none")
    outside = (indices < 0) | (indices >= n_total)
    if outside.any():
        fail("indices", f"must be in [0, n_total = {n_total}); {_first(outside, 'outside', indices)}")
    steps = np.diff(indices)
    if (steps <= 0).any():
        _, first = np.unique(indices, return_index=True)
        repeated = np.ones(n_kept, dtype=bool)
        repeated[first] = False
        if repeated.any():
            fail("indices", f"must be unique; {_first(repeated, 'a repeat', indices)}")
        fail("indices", f"must be sorted ascending; {_first(np.r_[False, steps < 0], 'below the one before', indices)}")
    weights = _array(selection.weights, "weights", n_kept, "n_kept", fail, kind=np.floating)
    nan, inf = np.isnan(weights), np.isinf(weights)
    not_positive = ~nan & ~inf & (weights <= 0)
    if (nan | inf | not_positive).any():
        found = [_first(mask, what, None if what == "NaN" else weights)
                 for mask, what in ((nan, "NaN"), (inf, "infinite"), (not_positive, "<= 0")) if mask.any()]
        fail("weights", "must be finite and > 0; " + ", ".join(found))
    total = float(weights.sum())
    if abs(total - n_total) > 1e-6 * n_total:
        fail("weights", f"must sum to n_total = {n_total} (the examples the kept set stands for) within a relative "
                        f"1e-6; found {total:.9g}")
    kept_labels = _array(selection.labels, "kept_labels", n_kept, "n_kept", fail)
    if (kept_labels < 0).any():
        fail("kept_labels", f"must be clusters >= 0; {_first(kept_labels < 0, 'negative', kept_labels)}")
    _array(saved.labels, "labels", n_total, "n_total", fail)
    _array(saved.raw_labels, "raw_labels", n_total, "n_total", fail)
    if saved.difficulty is not None:
        _array(saved.difficulty, "difficulty", n_kept, "n_kept", fail, kind=np.floating)
    if not isinstance(saved.config, dict):
        fail("config", "is missing" if saved.config is None else
             f"must be a dict (ClusterSelectConfig.to_dict()); found {type(saved.config).__name__}")
    try:
        ClusterSelectConfig.from_dict(saved.config)
    except (ValueError, TypeError) as error:
        fail("config", f"must be a valid ClusterSelectConfig; {' '.join(str(error).split()).rstrip('.')}")
    if not isinstance(saved.fingerprint, str) or not saved.fingerprint:
        fail("fingerprint", "is missing" if saved.fingerprint is None else
             f"must be a non-empty str; found {saved.fingerprint!r}")
    if not isinstance(saved.extra, dict):
        fail("extra", f"must be a dict; found {type(saved.extra).__name__}")
    for key in ("report", "model_config"):
        if saved.extra.get(key) is not None and not isinstance(saved.extra[key], dict):
            fail(f"extra.{key}", f"must be a dict; found {type(saved.extra[key]).__name__}")
    _check_recorded_duplicates((saved.extra.get("report") or {}).get("clustering_params"), fail)
    if n_examples is not None and n_total != n_examples:
        fail("n_total", f"is {n_total}, but the training data has {n_examples} examples: the selection was made on "
                        "other training data")


def _check_recorded_duplicates(params: Any, fail) -> None:
    """`extra.report.clustering_params`, which a resumed run compares and the model card reads: a dict, and its
    recorded `RESOLVED_PER_MODEL` values (near-duplicate settings, `noise_share`) a run could have resolved to."""
    if params is None:
        return
    if not isinstance(params, dict):
        fail("extra.report.clustering_params", f"must be a dict; found {type(params).__name__}")
    recorded = {k: params[k] for k in RESOLVED_PER_MODEL if k in params}
    try:
        settings = SelectionSettings(**recorded)
    except (ValueError, TypeError) as error:
        fail("extra.report.clustering_params", f"must record valid near-duplicate and noise settings; "
                                               f"{str(error).rstrip('.')}")
    if any(getattr(settings, key) == AUTO for key in recorded):
        fail("extra.report.clustering_params", "must record the near-duplicate and noise settings as resolved, "
                                               "not 'auto'")


def check_saved_against(saved: SavedSelection, *, n_examples: int, fingerprint: str, config: ClusterSelectConfig,
                        target_fingerprint: str | None = None, model_config: dict | None = None,
                        duplicates: dict | None = None, ignore: tuple[str, ...] = (),
                        check_model: bool = True) -> None:
    """Refuse a saved selection made for another run than the one about to adopt it.

    Args:
        saved (`SavedSelection`): from a checkpoint (`persistence.load_selection`) or given by the user.
        n_examples (`int`): examples in this run's training data.
        fingerprint (`str`): `persistence.data_fingerprint` of this run's training data.
        config (`ClusterSelectConfig`): this run's selection settings.
        target_fingerprint (`str`, *optional*): fingerprint of this run's target set (`None`: none).
        model_config (`dict`, *optional*): `feature_cache.model_config_dict` of this run's model.
        duplicates (`dict`, *optional*): this run's near-duplicate and noise settings resolved for its model
            (`RunFacts.duplicates`), compared with what the saved run recorded (`config_differences`).
        ignore (`tuple[str, ...]`, *optional*): config fields that may differ.
        check_model (`bool`, *optional*, defaults to `True`): also compare the target set and the model.
    Raises:
        ValueError: first, if its contents fail `validate_saved_selection` for `n_examples` (non-finite or
            non-positive weights, indices out of range, repeated or unsorted, labels of the wrong length, …: the file
            and field are named); then if it was made on different training data (fingerprint of the tokens and
            lengths), (`check_model`) for another target set or none, with a `ClusterSelectConfig` that selects
            differently (`config_differences`), or (`check_model`) for a model of another class or config — the
            fields that differ are named.
    """
    validate_saved_selection(saved, n_examples=n_examples)  # before anything is compared or adopted
    if saved.fingerprint != fingerprint:
        raise ValueError(
            "the selection saved in the checkpoint was made on different training data (fingerprint mismatch); "
            "resume with the same `train_dataset` or start a new run."
        )
    saved_target = saved.extra.get("target_fingerprint")
    if check_model and saved_target != target_fingerprint:
        both = bool(saved_target) and bool(target_fingerprint)
        made = "another target set" if both else "a target set" if saved_target else "no target set"
        now = "" if both else f" (this run has {'one' if target_fingerprint else 'none'})"
        raise ValueError(f"the selection saved in the checkpoint was made for {made}{now}; resume with the same "
                         "`target_dataset` (or `eval_dataset` for target='eval'), or start a new run.")
    changed = config_differences(saved.config or {}, config.to_dict(), ignore,
                                 (saved.extra.get("report") or {}).get("clustering_params"), duplicates)
    if changed:
        raise ValueError(
            "the selection saved in the checkpoint was made with other selection settings ("
            + "; ".join(changed) + "); resume with the same `cluster_config`, or start a new run (without "
            "`resume_from_checkpoint` or `selection=`) to select again."
        )
    if check_model and saved.extra.get("model_config") and model_config:
        old, new = saved.extra["model_config"], model_config
        changed = [f"{k}: {old.get(k, '(unset)')!r} in the checkpoint, {new.get(k, '(unset)')!r} now"
                   for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        if changed:
            raise ValueError(
                "the selection saved in the checkpoint was made for another model (" + "; ".join(changed[:6])
                + ("; …" if len(changed) > 6 else "") + "); resume with the model of that run, or start a new "
                "run (without `resume_from_checkpoint` or `selection=`) to select again."
            )
