"""Saving and loading a selection next to a checkpoint (layer L2).

A checkpoint folder gets `cluster_selection.npz`: kept indices, per-example weights, the cluster label and raw
clusterer label of every example, the config and a fingerprint of the training data. The file is written to a
temporary name and renamed, so it is either complete or absent, never half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from ._types import Selection

SELECTION_FILENAME = "cluster_selection.npz"


def data_fingerprint(lengths: np.ndarray) -> str:
    """SHA-1 of the example count and per-example lengths: changes when the training data changes.

    Args:
        lengths (`np.ndarray` of shape `[n_examples]`): token length of every training example.
    Returns:
        `str`: hex digest.
    """
    array = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    digest = hashlib.sha1(str(array.shape[0]).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


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
    """

    selection: Selection
    labels: np.ndarray
    raw_labels: np.ndarray
    config: dict
    fingerprint: str
    extra: dict


def save_selection(
    folder: str,
    selection: Selection,
    *,
    labels: np.ndarray,
    raw_labels: np.ndarray,
    config: dict,
    fingerprint: str,
    extra: dict | None = None,
) -> str:
    """Write `folder/cluster_selection.npz` atomically (temporary file + `os.replace`).

    Args:
        folder (`str`): existing folder, e.g. a checkpoint.
        selection (`Selection`): the selection to save.
        labels (`np.ndarray` of shape `[n_examples]`): cluster of every example.
        raw_labels (`np.ndarray` of shape `[n_examples]`): clusterer label of every example (-1 = noise).
        config (`dict`): the selection config as a dictionary.
        fingerprint (`str`): `data_fingerprint` of the training data.
        extra (`dict`, *optional*): JSON-serialisable measured figures to keep with it.
    Returns:
        `str`: the path written.
    Raises:
        FileNotFoundError: if `folder` does not exist.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"`folder` {folder!r} does not exist.")
    meta = json.dumps({"config": config, "fingerprint": fingerprint, "n_total": selection.n_total, "extra": extra or {}})
    path = os.path.join(folder, SELECTION_FILENAME)
    handle, tmp = tempfile.mkstemp(prefix=".cluster_selection.", suffix=".npz.tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            np.savez(
                f,
                indices=np.asarray(selection.indices, dtype=np.int64),
                weights=np.asarray(selection.weights, dtype=np.float64),
                kept_labels=np.asarray(selection.labels, dtype=np.int64),
                labels=np.asarray(labels, dtype=np.int64),
                raw_labels=np.asarray(raw_labels, dtype=np.int64),
                meta=np.array(meta),
            )
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def load_selection(folder: str) -> SavedSelection | None:
    """Read `folder/cluster_selection.npz`; `None` when the folder has none.

    Raises:
        ValueError: if the file exists but is unreadable or inconsistent.
    """
    path = os.path.join(folder, SELECTION_FILENAME)
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            selection = Selection(
                indices=data["indices"].copy(),
                weights=data["weights"].copy(),
                labels=data["kept_labels"].copy(),
                n_total=int(meta["n_total"]),
            )
            labels, raw_labels = data["labels"].copy(), data["raw_labels"].copy()
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"{path} is not a readable selection file: {error}") from error
    return SavedSelection(
        selection=selection,
        labels=labels,
        raw_labels=raw_labels,
        config=meta["config"],
        fingerprint=meta["fingerprint"],
        extra=meta.get("extra", {}),
    )
