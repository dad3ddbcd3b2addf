"""Saving and loading a selection next to a checkpoint (layer L2).

A checkpoint folder gets `cluster_selection.npz`: kept indices, per-example weights, the cluster label and raw
clusterer label of every example, the kept examples' difficulty (feature-pass loss, for `order="easy_to_hard"`;
absent in files of older versions), the config and a fingerprint of the training data. The file is written to a
temporary name and renamed, so it is either complete or absent, never half-written.
`saved_selection.validate_saved_selection` checks its contents (on load, and again against the dataset before a run
adopts it): a NaN or negative weight, an index out of range or repeated, labels of the wrong length would otherwise
be trained on without a word.

`resolve_resume_checkpoint` picks or checks the checkpoint a run resumes from: transformers writes a checkpoint's
files in place (`trainer_state.json` last) and our selection after it, so a run killed while saving leaves a
folder that looks like a checkpoint but is not complete; it is skipped (`True`) or refused (a path).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import zipfile
import zlib

import numpy as np

from ._types import Selection
from .atomic import atomic_open, temporary_pattern
from .saved_selection import (NOT_SELECTION_FIELDS, SavedSelection, config_differences,  # noqa: F401 (re-exported)
                              validate_saved_selection)

SELECTION_FILENAME = "cluster_selection.npz"
TRAINER_STATE_FILENAME = "trainer_state.json"  # transformers' TRAINER_STATE_NAME, written last into a checkpoint
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

logger = logging.getLogger(__name__)


def data_fingerprint(lengths: np.ndarray, tokens: str | None = None) -> str:
    """SHA-1 of the example count, the per-example lengths and (when given) a digest of the tokens themselves
    (`data.token_digest`): changes when the training data changes, also for other data of the same lengths.

    Args:
        lengths (`np.ndarray` of shape `[n_examples]`): token length of every training example.
        tokens (`str`, *optional*): `data.token_digest` of the training data.
    Returns:
        `str`: hex digest.
    """
    array = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    digest = hashlib.sha1(str(array.shape[0]).encode())
    digest.update(array.tobytes())
    if tokens is not None:
        digest.update(b"tokens:" + tokens.encode())
    return digest.hexdigest()


def save_selection(folder: str, selection: Selection, *, labels: np.ndarray, raw_labels: np.ndarray, config: dict,
                   fingerprint: str, extra: dict | None = None, difficulty: np.ndarray | None = None) -> str:
    """Write `folder/cluster_selection.npz` atomically (temporary file + `os.replace`).

    Args:
        folder (`str`): existing folder, e.g. a checkpoint.
        selection (`Selection`): the selection to save.
        labels (`np.ndarray` of shape `[n_examples]`): cluster of every example.
        raw_labels (`np.ndarray` of shape `[n_examples]`): clusterer label of every example (-1 = noise).
        config (`dict`): the selection config as a dictionary.
        fingerprint (`str`): `data_fingerprint` of the training data.
        extra (`dict`, *optional*): JSON-serialisable measured figures to keep with it.
        difficulty (`np.ndarray` of shape `[n_kept]`, float, *optional*): feature-pass loss of each kept example, so
            that a resumed `order="easy_to_hard"` run replays the same batches.
    Returns:
        `str`: the path written.
    Raises:
        FileNotFoundError: if `folder` does not exist.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"`folder` {folder!r} does not exist.")
    meta = json.dumps({"config": config, "fingerprint": fingerprint, "n_total": selection.n_total, "extra": extra or {}})
    path = os.path.join(folder, SELECTION_FILENAME)
    for stale in glob.glob(temporary_pattern(path)):  # left by a run killed mid-write
        os.remove(stale)
    with atomic_open(path, "wb") as f:
        optional = {} if difficulty is None else {"difficulty": np.asarray(difficulty, dtype=np.float64)}
        np.savez(f, indices=np.asarray(selection.indices, dtype=np.int64),
                 weights=np.asarray(selection.weights, dtype=np.float64),
                 kept_labels=np.asarray(selection.labels, dtype=np.int64), labels=np.asarray(labels, dtype=np.int64),
                 raw_labels=np.asarray(raw_labels, dtype=np.int64), meta=np.array(meta), **optional)
    return path


_ARRAYS = ("indices", "weights", "kept_labels", "labels", "raw_labels", "difficulty")
_UNREADABLE = (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile, zlib.error)


def _read_selection(path: str) -> SavedSelection:
    """The raw contents of a selection file, unchecked (a missing array or meta entry is `None`).

    Raises:
        ValueError: if the file is not a readable `.npz` archive with a JSON object in `meta` (empty, truncated,
            another format), in one line.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
        if not head:
            raise ValueError("empty file (0 bytes)")
        if head[:2] != b"PK":  # every zip archive, hence every .npz, starts so
            raise ValueError(f"not an .npz (zip) archive; it starts with {head!r}")
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name].copy() if name in data.files else None for name in _ARRAYS}
            meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
        if not isinstance(meta, dict):
            raise ValueError(f"`meta` must be a JSON object, found {type(meta).__name__}")
    except _UNREADABLE as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        if isinstance(error, (zipfile.BadZipFile, EOFError, zlib.error)):
            reason = f"truncated or damaged .npz archive ({reason})"
        elif isinstance(error, json.JSONDecodeError):
            reason = f"`meta` is not valid JSON ({reason})"
        raise ValueError(f"{path} is not a readable selection file: {reason}") from error
    selection = Selection(indices=arrays["indices"], weights=arrays["weights"], labels=arrays["kept_labels"],
                          n_total=meta.get("n_total"))
    return SavedSelection(selection=selection, labels=arrays["labels"], raw_labels=arrays["raw_labels"],
                          config=meta.get("config"), fingerprint=meta.get("fingerprint"),
                          extra=meta.get("extra", {}), path=path, difficulty=arrays["difficulty"])


def load_selection(folder: str) -> SavedSelection | None:
    """Read `folder/cluster_selection.npz` and check it (`validate_saved_selection`); `None` when there is none.

    Raises:
        ValueError: if the file exists but is unreadable (empty, truncated, not an `.npz`) or fails a check; one
            line naming the file (and the field).
    """
    path = os.path.join(folder, SELECTION_FILENAME)
    if not os.path.isfile(path):
        return None
    saved = _read_selection(path)
    validate_saved_selection(saved, path)
    return saved


def checkpoint_problems(folder: str, warmup_steps: int) -> list[str]:
    """What a checkpoint folder lacks to be resumed from; empty when it is complete.

    Complete means: `trainer_state.json` readable (transformers writes it after the weights, optimizer, scheduler
    and RNG state), model weights present, and, for a checkpoint saved after selection (`global_step > warmup_steps`), a readable
    `cluster_selection.npz` (its contents are checked when the run loads it: `validate_saved_selection`).

    Args:
        folder (`str`): a `checkpoint-<step>` folder.
        warmup_steps (`int`): the run's planned warm-up steps (selection happens right after them).
    Returns:
        `list[str]`: one sentence per problem.
    """
    state_path = os.path.join(folder, TRAINER_STATE_FILENAME)
    if not os.path.isdir(folder):
        return [f"{folder} is not a folder"]
    try:
        with open(state_path, encoding="utf-8") as handle:
            global_step = int(json.load(handle)["global_step"])
    except FileNotFoundError:
        return [f"no {TRAINER_STATE_FILENAME} (Trainer writes it last)"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"unreadable {TRAINER_STATE_FILENAME} ({type(error).__name__}: {error})"]
    entries = os.listdir(folder)
    has_weights = any(
        name.endswith((".safetensors", ".bin", ".index.json")) or os.path.isdir(os.path.join(folder, name))
        for name in entries
    )  # model/adapter weights, sharded or not, or a DeepSpeed / FSDP state folder
    if not has_weights:
        return ["no model weights (*.safetensors, *.bin or a DeepSpeed/FSDP folder)"]
    if global_step <= warmup_steps:
        return []
    path = os.path.join(folder, SELECTION_FILENAME)
    if not os.path.isfile(path):
        return [f"no {SELECTION_FILENAME} although it was saved after selection (step {global_step} > "
                f"warmup_steps {warmup_steps})"]
    try:  # readable is complete; its contents are checked, and refused by name, when the run loads it
        _read_selection(path)
    except ValueError as error:
        return [str(error)]
    return []


def resolve_resume_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str, warmup_steps: int):
    """The checkpoint to hand to `Trainer.train(resume_from_checkpoint=...)`, never an incomplete one.

    Args:
        resume_from_checkpoint (`str`, `bool` or `None`): what the user passed; `True` = the latest checkpoint in
            `output_dir`.
        output_dir (`str`): `TrainingArguments.output_dir`.
        warmup_steps (`int`): the run's planned warm-up steps.
    Returns:
        `None` for `None`/`False`; for `True`, the newest complete `checkpoint-<step>` folder (incomplete newer ones
        are skipped with a warning); a complete path unchanged.
    Raises:
        ValueError: if `True` finds no checkpoint (transformers' message), or the given path, or every checkpoint in
            `output_dir` for `True`, is incomplete; the message lists what is missing and the complete checkpoints to
            use instead.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
        found = sorted((int(m.group(1)), n) for n in names if (m := _CHECKPOINT.match(n)))
        skipped = []
        for _, name in reversed(found):
            folder = os.path.join(output_dir, name)
            problems = checkpoint_problems(folder, warmup_steps)
            if not problems:
                if skipped:
                    logger.warning("Resuming from %s; skipped incomplete checkpoints (interrupted while saving?): %s",
                                   folder, "; ".join(skipped))
                return folder
            skipped.append(f"{name}: {', '.join(problems)}")
        if found:
            raise ValueError(
                f"no complete checkpoint in `output_dir` {output_dir!r} to resume from: {'; '.join(skipped)}. "
                "Start a new run (resume_from_checkpoint=None)."
            )
        raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
    folder = os.fspath(resume_from_checkpoint)
    problems = checkpoint_problems(folder, warmup_steps) if os.path.isdir(folder) else []
    if problems:
        parent = os.path.dirname(os.path.abspath(folder))
        complete = sorted(
            (n for n in os.listdir(parent) if _CHECKPOINT.match(n) and n != os.path.basename(folder)
             and not checkpoint_problems(os.path.join(parent, n), warmup_steps)),
            key=lambda n: int(n.split("-")[1]),
        )
        raise ValueError(
            f"`resume_from_checkpoint` {folder!r} is incomplete ({'; '.join(problems)}); the run was probably "
            f"interrupted while saving it. Resume from a complete checkpoint instead (complete: {complete or 'none'}),"
            " or pass resume_from_checkpoint=True to pick the latest complete one."
        )
    return resume_from_checkpoint
