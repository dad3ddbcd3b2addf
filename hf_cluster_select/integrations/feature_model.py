"""What a ClusterTrainer can be given instead of computing it (layer L4): `feature_model=` (features from another
model than the trained one) and `selection=` (a saved selection, reused without any feature pass).

A smaller model that shares the tokenizer makes the feature pass cheaper (S2L, Yang et al., 2024: selection with a
100× smaller proxy); see also `features/proxy.py` for the built-in proxy (`ClusterSelectConfig.feature_layers`).
"""

from __future__ import annotations

import os

import torch

from ..persistence import SELECTION_FILENAME, SavedSelection, load_selection


def load_feature_model(feature_model: torch.nn.Module | str | None,
                       model: torch.nn.Module | None) -> torch.nn.Module | None:
    """`ClusterTrainer(feature_model=...)` checked and loaded: a module as is, a path with the trained model's class
    (`from_pretrained`, the base class under PEFT), `None` as `None`.

    Raises:
        TypeError: for another type.
        ValueError: for a path without `config.json`, or a vocabulary smaller than the trained model's.
    """
    if feature_model is None:
        return None
    if isinstance(feature_model, (str, os.PathLike)):
        path = os.fspath(feature_model)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"`feature_model` must be a model or the folder of one (with config.json), got {path!r}.")
        base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        if base is None:
            raise TypeError("`feature_model` given as a path needs `model` to know which class to load it with.")
        feature_model = type(base).from_pretrained(path)
    if not isinstance(feature_model, torch.nn.Module):
        raise TypeError(f"`feature_model` must be a torch.nn.Module, a path or None, got {type(feature_model).__name__}.")
    ours, theirs = (getattr(getattr(m, "config", None), "vocab_size", None) for m in (model, feature_model))
    if isinstance(ours, int) and isinstance(theirs, int) and theirs < ours:
        raise ValueError(f"`feature_model` has a vocabulary of {theirs} tokens, the trained model {ours}: they must "
                         "share the tokenizer.")
    return feature_model.eval()


def load_given_selection(selection) -> SavedSelection | None:
    """`ClusterTrainer(selection=...)` loaded: a `SavedSelection` as is, or a folder holding `cluster_selection.npz`
    (a run's `output_dir` or checkpoint), or that file's path; `None` as `None`.

    Raises:
        TypeError: for another type.
        ValueError: if the path holds no selection file or an unreadable one.
    """
    if selection is None or isinstance(selection, SavedSelection):
        return selection
    if not isinstance(selection, (str, os.PathLike)):
        raise TypeError("`selection` must be a folder or file saved by ClusterTrainer (cluster_selection.npz), a "
                        f"SavedSelection or None, got {type(selection).__name__}.")
    path = os.fspath(selection)
    folder = os.path.dirname(path) if path.endswith(".npz") else path
    if path.endswith(".npz") and os.path.basename(path) != SELECTION_FILENAME:
        raise ValueError(f"`selection` file must be named {SELECTION_FILENAME}, got {path!r}.")
    saved = load_selection(folder)
    if saved is None:
        raise ValueError(f"`selection`: no {SELECTION_FILENAME} in {folder!r} (a ClusterTrainer's output_dir or "
                         "checkpoint folder holds one).")
    return saved

