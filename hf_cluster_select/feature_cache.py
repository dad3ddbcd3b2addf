"""Feature cache keyed on identity: data, model weights, tokenizer and feature settings (layer L2).

A second run on the same inputs loads the per-example features instead of recomputing them; any change of a key
part computes them again. The key is the SHA-1 of:

- the data: `persistence.data_fingerprint` (every example's length, and `data.token_digest`, a content hash of
  every column: tokens, labels, attention mask, …; a content hash rather than `datasets`' `_fingerprint`, which is
  random for in-memory datasets) and the collator classes that build the feature batches;
- the model: a digest of its config (without `UNSTABLE_CONFIG_KEYS` such as `_name_or_path`, so a copy in another
  folder hits) and of the weights used for the features (`weights_digest`: per parameter its name, shape, dtype, the float64
  sum and sum of squares of all its values and a strided sample of ≤ 4,096 raw values; after the warm-up, so a
  different warm-up misses);
- the tokenizer (`tokenizer_digest`: class and vocabulary), when the trainer has one;
- every setting that changes features (`FEATURE_FIELDS`, from `ClusterSelectConfig.resolved()`) and whether labels are shifted.

Entries are folders of `.npy` files (the feature matrix is memory-mapped on load) written under a temporary name
and renamed, so a killed write never leaves a half entry. The folder is `$HF_CLUSTER_SELECT_CACHE`, else
`~/.cache/hf_cluster_select/features`; `ClusterSelectConfig(feature_cache=False)` turns the cache off. Under
DeepSpeed ZeRO-3 (parameters partitioned away: empty local tensors) the weights cannot be hashed and the cache is
off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

from . import distributed
from .config import ClusterSelectConfig
from ._types import RunFacts

CACHE_ENV = "HF_CLUSTER_SELECT_CACHE"
FEATURE_FIELDS = ("feature", "feature_context", "projection_dim", "feature_layers", "selection_seed")
SAMPLED_VALUES = 4096  # raw values hashed per parameter, evenly strided, besides its sum and sum of squares
ARRAYS = ("features", "loss_tokens", "norms", "losses")
# keys that differ between copies of one model (`architectures` is set by save_pretrained; the class is compared),
# or that training code flips at run time (dtype: in the weights digest)
UNSTABLE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash", "use_cache", "dtype", "torch_dtype",
                        "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
                        "output_attentions", "output_hidden_states", "return_dict", "pad_token_id", "architectures")


def default_cache_dir() -> str:
    """`$HF_CLUSTER_SELECT_CACHE`, else `~/.cache/hf_cluster_select/features`."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hf_cluster_select",
                                                     "features")


def _sha1(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def model_config_dict(model: torch.nn.Module) -> dict:
    """The model's config as a plain dict (`to_diff_dict`), without the keys that differ between copies of the same
    model or that training code changes at run time (`UNSTABLE_CONFIG_KEYS`), plus its class name under
    `"model_class"` (only that for a model without a config)."""
    config = getattr(model, "config", None)
    values = dict(config.to_diff_dict()) if hasattr(config, "to_diff_dict") else {}
    for key in UNSTABLE_CONFIG_KEYS:
        values.pop(key, None)
    values["model_class"] = type(model).__name__
    return json.loads(json.dumps(values, sort_keys=True, default=str))


def weights_digest(model: torch.nn.Module) -> str | None:
    """Digest of the model's parameters on this rank: per parameter its name, shape and dtype, the float64 sum and
    sum of squares of all its values, and `SAMPLED_VALUES` evenly strided raw values (so a change anywhere moves the
    sums and a change of a single value is seen with probability about 4,096 / numel per tensor, as well as by the sums).

    Args:
        model (`torch.nn.Module`): any model (PEFT adapters included: every `named_parameters` entry).
    Returns:
        `str` hex digest, or `None` when a parameter is empty on this rank (DeepSpeed ZeRO-3 partitioning).
    """
    digest = hashlib.sha1()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.numel() == 0:
                return None
            flat = parameter.detach().reshape(-1)
            count = min(flat.numel(), SAMPLED_VALUES)  # evenly strided, first and last included (int64 arithmetic)
            index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
            sample = flat[index].cpu().contiguous()
            total = torch.zeros(2, dtype=torch.float64, device=flat.device)
            for chunk in flat.split(1 << 22):  # float64 in chunks of 4M values: bounded extra memory on the device
                chunk = chunk.double()
                total += torch.stack([chunk.sum(), (chunk * chunk).sum()])
            sums = total.cpu().numpy()
            digest.update(f"{name}|{tuple(parameter.shape)}|{parameter.dtype}".encode())
            digest.update(sums.tobytes())
            digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str | None:
    """Digest of a tokenizer's class and vocabulary (`get_vocab()`); `None` without a tokenizer or vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    return _sha1([type(tokenizer).__name__, sorted(get_vocab().items())])


def feature_identity(model: torch.nn.Module, config: ClusterSelectConfig, facts: RunFacts, *, data_fingerprint: str,
                     collator: Any = None, tokenizer: Any = None) -> dict | None:
    """Every part of the cache key, identical on every rank (the weight digests of all ranks are combined: FSDP
    shards hash their own part); `None` when the weights cannot be hashed (see `weights_digest`). The resolved
    feature, its blocks and the label shift come from the run's `facts`. Collective under torch.distributed: every
    rank must call it."""
    local = weights_digest(model)
    digests = distributed.gather_objects(local)
    if any(d is None for d in digests):
        return None
    return {
        "data": data_fingerprint,
        "collator": _collator_chain(collator),
        "model_config": _sha1(model_config_dict(model)),
        "weights": _sha1(digests),
        "tokenizer": tokenizer_digest(tokenizer),
        "settings": {name: config.resolved()[name] for name in FEATURE_FIELDS},
        "resolved_feature": [facts.feature, facts.feature_layers],
        "shift_labels": facts.shift_labels,
        "world_size": len(digests),
    }


def _collator_chain(collator: Any) -> list[str]:
    """Class names of a collator and of the collators it wraps (`.collator` attributes), outermost first."""
    chain = []
    while collator is not None and len(chain) < 8:
        chain.append(type(collator).__name__)
        collator = getattr(collator, "collator", None)
    return chain


class FeatureCache:
    """Folders of features under `directory`, one per identity key (see the module docstring).

    Args:
        directory (`str`, *optional*): the cache folder; `default_cache_dir()` when `None`.
    """

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or default_cache_dir()

    @staticmethod
    def key(identity: dict) -> str:
        """SHA-1 hex of the identity (`feature_identity`)."""
        return _sha1(identity)

    def path(self, identity: dict) -> str:
        return os.path.join(self.directory, self.key(identity))

    def load(self, identity: dict) -> dict[str, np.ndarray] | None:
        """The cached arrays (`features` `[n_examples, dim]` memory-mapped copy-on-write, `loss_tokens` `[n_examples]`,
        and `norms` / `losses` `[n_examples]` when they were stored), or `None` on a miss or an unreadable entry."""
        folder = self.path(identity)
        if not os.path.isfile(os.path.join(folder, "identity.json")):
            return None
        try:
            arrays = {name: np.load(os.path.join(folder, name + ".npy"), mmap_mode="c" if name == "features" else None)
                      for name in ARRAYS if os.path.isfile(os.path.join(folder, name + ".npy"))}
        except (OSError, ValueError):
            return None
        return arrays if {"features", "loss_tokens"} <= arrays.keys() else None

    def save(self, identity: dict, arrays: dict[str, np.ndarray | None]) -> str:
        """Store `arrays` (the names of `load`; `None` values are left out) with their identity; returns the folder.
        An existing entry for the same key is kept (same identity, same features)."""
        folder = self.path(identity)
        if os.path.isdir(folder):
            return folder
        os.makedirs(self.directory, exist_ok=True)
        staging = tempfile.mkdtemp(dir=self.directory, prefix=".staging-")
        try:
            for name, value in arrays.items():
                if value is not None:
                    np.save(os.path.join(staging, name + ".npy"), np.asarray(value))
            with open(os.path.join(staging, "identity.json"), "w", encoding="utf-8") as handle:
                json.dump(identity, handle, indent=2, sort_keys=True, default=str)
            os.replace(staging, folder)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not os.path.isdir(folder):
                raise
        return folder
