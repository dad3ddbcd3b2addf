"""What a ClusterTrainer can be given instead of computing it (layer L4): `feature_model=` (features from another
model than the trained one) and `selection=` (a saved selection, reused without any feature pass).

A smaller model that shares the tokenizer makes the feature pass cheaper (S2L, Yang et al., 2024: selection with a
100× smaller proxy); see also `features/proxy.py` for the built-in proxy (`ClusterSelectConfig.feature_layers`).
"""

from __future__ import annotations

import os

import torch

from ..persistence import SELECTION_FILENAME, load_selection
from ..saved_selection import SavedSelection, validate_saved_selection


def _head_kind(model: torch.nn.Module) -> str:
    """`"lm"` for a model with output embeddings (causal LM, encoder–decoder), else `"classification"`."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    getter = getattr(base, "get_output_embeddings", None)
    try:
        return "lm" if callable(getter) and isinstance(getter(), torch.nn.Module) else "classification"
    except (NotImplementedError, AttributeError):
        return "classification"


def load_feature_model(feature_model: torch.nn.Module | str | None,
                       model: torch.nn.Module | None) -> torch.nn.Module | None:
    """`ClusterTrainer(feature_model=...)` checked and loaded: a module as is; a path with the `AutoModel` class of
    the trained model's task (`AutoModelForCausalLM`, `AutoModelForSeq2SeqLM` or
    `AutoModelForSequenceClassification`, so any architecture loads as itself); `None` as `None`. Checked before
    any training: the same kind of head as the trained model, a vocabulary at least as large (shared tokenizer),
    and for classification the same number of labels.

    Raises:
        TypeError: for another type.
        ValueError: for a path without `config.json`, another kind of head, a smaller vocabulary, or another
            number of labels — each naming `feature_model`.
    """
    if feature_model is None:
        return None
    if model is None:
        raise TypeError("`feature_model` needs `model`: it is checked against the trained model.")
    kind = _head_kind(model)
    if isinstance(feature_model, (str, os.PathLike)):
        path = os.fspath(feature_model)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"`feature_model` must be a model or the folder of one (with config.json), got {path!r}.")
        import transformers

        config = getattr(model, "config", None)
        if kind == "classification":
            auto, extra = transformers.AutoModelForSequenceClassification, {"num_labels": config.num_labels}
        elif getattr(config, "is_encoder_decoder", False):
            auto, extra = transformers.AutoModelForSeq2SeqLM, {}
        else:
            auto, extra = transformers.AutoModelForCausalLM, {}
        feature_model = auto.from_pretrained(path, **extra)
    if not isinstance(feature_model, torch.nn.Module):
        raise TypeError(f"`feature_model` must be a torch.nn.Module, a path or None, got {type(feature_model).__name__}.")
    if _head_kind(feature_model) != kind:
        raise ValueError(f"`feature_model` ({type(feature_model).__name__}) has another kind of output head than the "
                         f"trained model ({type(model).__name__}): both must be language models or both classifiers.")
    ours, theirs = (getattr(m, "config", None) for m in (model, feature_model))
    if kind == "lm":
        vocab, their_vocab = getattr(ours, "vocab_size", None), getattr(theirs, "vocab_size", None)
        if isinstance(vocab, int) and isinstance(their_vocab, int) and their_vocab < vocab:
            raise ValueError(f"`feature_model` has a vocabulary of {their_vocab} tokens, the trained model {vocab}: "
                             "they must share the tokenizer.")
    elif getattr(ours, "num_labels", None) != getattr(theirs, "num_labels", None):
        raise ValueError(f"`feature_model` has {getattr(theirs, 'num_labels', None)} labels, the trained model "
                         f"{getattr(ours, 'num_labels', None)}: they must classify into the same labels.")
    return feature_model.eval()


def load_given_selection(selection) -> SavedSelection | None:
    """`ClusterTrainer(selection=...)` loaded and checked (`saved_selection.validate_saved_selection`): a
    `SavedSelection`, or a folder holding `cluster_selection.npz` (a run's `output_dir` or checkpoint), or that
    file's path; `None` as `None`. `SelectionRun.check_saved` checks it again against the dataset in `train()`.

    Raises:
        TypeError: for another type.
        ValueError: if the path holds no selection file or an unreadable one, or its contents fail a check (the
            file and field are named).
    """
    if selection is None:
        return None
    if isinstance(selection, SavedSelection):
        validate_saved_selection(selection)
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

