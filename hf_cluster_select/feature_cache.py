"""Feature cache keyed on identity: data, collator, model weights, tokenizer and feature settings (layer L2).

A second run on the same inputs loads the per-example features instead of recomputing them; any change of a key
part computes them again. The key is the SHA-1 of:

- the data: `persistence.data_fingerprint` (every example's length, and `data.token_digest`, a content hash of
  every column: tokens, labels, attention mask, …; not `datasets`' `_fingerprint`, random for in-memory data);
- the collator by what it does: its qualified class names and `collator_probe`, the batch it builds from the
  feature pass's first and last examples (the same class masking other labels is another key) and the data size;
- the model: a digest of its config (without `UNSTABLE_CONFIG_KEYS` such as `_name_or_path`, so a copy in another
  folder hits) and of the weights used for the features (`weights_digest`: per parameter its name, shape, dtype,
  the float64 sum and sum of squares of all its values and a strided sample of ≤ 4,096 raw values; after the
  warm-up, so a different warm-up misses);
- the tokenizer (`tokenizer_digest`: class and vocabulary), when the trainer has one;
- every setting that changes features (`FEATURE_FIELDS`, from `ClusterSelectConfig.resolved()`), the label shift.

An entry is a folder named by its key: the arrays as `.npy` (features memory-mapped on load), `identity.json` and
`manifest.json` (creation time; per array its shape, dtype, whether it was finite and the SHA-256 of its bytes),
written in a `.staging-*` folder and renamed (a killed write leaves no half entry; staging folders untouched for
`STALE_STAGING_SECONDS` are removed when the cache is read or written: an age, not a process id, so it holds for a
cache shared by several machines). Every load checks the entry (manifest, `check_arrays`); a bad one is named in
one logged warning, removed and a miss, so the feature pass recomputes it and its save replaces it. The folder is
`$HF_CLUSTER_SELECT_CACHE`, else `~/.cache/hf_cluster_select/features` (`hf-cluster-select cache list|clear`);
`ClusterSelectConfig(feature_cache=False)` turns it off, and so does DeepSpeed ZeRO-3 (unhashable weights).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from . import distributed
from .config import ClusterSelectConfig
from ._types import RunFacts
from .features.choice import forward_in_bf16

logger = logging.getLogger(__name__)

CACHE_ENV = "HF_CLUSTER_SELECT_CACHE"
FEATURE_FIELDS = ("feature", "feature_context", "projection_dim", "feature_layers", "selection_seed")
SAMPLED_VALUES = 4096  # raw values hashed per parameter, evenly strided, besides its sum and sum of squares
ARRAYS = ("features", "loss_tokens", "norms", "losses", "inputs")
# keys that differ between copies of one model (`architectures` is set by save_pretrained; the class is compared),
# or that training code flips at run time (dtype: in the weights digest)
UNSTABLE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash", "use_cache", "dtype", "torch_dtype",
                        "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
                        "output_attentions", "output_hidden_states", "return_dict", "pad_token_id", "architectures")
PROBE_EXAMPLES = 4  # the collator probe: the dataset's first examples, and its last one
MANIFEST, STAGING_PREFIX, STALE_STAGING_SECONDS, KEY_PATTERN = "manifest.json", ".staging-", 3600, r"[0-9a-f]{40}"
CHUNK_BYTES = 1 << 26  # arrays are checked in 64-MiB chunks (bounded extra memory for memory-mapped features)


def default_cache_dir() -> str:
    """`$HF_CLUSTER_SELECT_CACHE`, else `~/.cache/hf_cluster_select/features`."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache/hf_cluster_select/features")


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
            digest.update(f"{name}|{tuple(parameter.shape)}|{parameter.dtype}".encode())
            digest.update(total.cpu().numpy().tobytes())
            digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str | None:
    """Digest of a tokenizer's class and vocabulary (`get_vocab()`); `None` without a tokenizer or vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    return _sha1([type(tokenizer).__name__, sorted(get_vocab().items())])


def feature_identity(model: torch.nn.Module, config: ClusterSelectConfig, facts: RunFacts, *, data_fingerprint: str,
                     collator: Any = None, tokenizer: Any = None, probe: Any = None) -> dict | None:
    """Every part of the cache key, identical on every rank (the weight digests of all ranks are combined: FSDP
    shards hash their own part); `None` when the weights cannot be hashed (see `weights_digest`). The resolved
    feature, its blocks and the label shift come from the run's `facts`. `probe` is the feature pass's dataset
    (what `collator` is applied to): its size and `collator_probe` join the identity. Collective under
    torch.distributed: every rank must call it."""
    local = weights_digest(model)
    digests = distributed.gather_objects(local)
    if any(d is None for d in digests):
        return None
    resolved = config.resolved()
    return {
        "data": data_fingerprint,
        "n_examples": None if probe is None else len(probe),
        "collator": _collator_chain(collator),
        "collator_probe": collator_probe(collator, probe),
        "model_config": _sha1(model_config_dict(model)),
        "weights": _sha1(digests),
        "tokenizer": tokenizer_digest(tokenizer),
        "settings": {name: resolved[name] for name in FEATURE_FIELDS},
        "resolved_feature": [facts.feature, facts.feature_layers, forward_in_bf16(model, facts.feature_autocast)],
        "shift_labels": facts.shift_labels,
        "world_size": len(digests),
    }


def _collator_chain(collator: Any) -> list[str]:
    """Qualified class names of a collator and of the collators it wraps (`.collator`), outermost first."""
    chain = []
    while collator is not None and len(chain) < 8:
        chain.append(f"{type(collator).__module__}.{type(collator).__qualname__}")
        collator = getattr(collator, "collator", None)
    return chain


def collator_probe(collator: Any, dataset: Any) -> str | None:
    """SHA-256 of the batch `collator` builds from `dataset`'s first `PROBE_EXAMPLES` examples and its last one
    (every tensor's key, dtype, shape and values; other values by type and text), under fixed seeds of torch (CPU),
    numpy and `random`, restored afterwards. `None` without a collator or dataset; a sentence naming the error type
    when the collator fails (logged, not raised)."""
    if collator is None or dataset is None:
        return None
    n = len(dataset)
    rows = sorted(set(range(min(PROBE_EXAMPLES, n))) | ({n - 1} if n else set()))
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0), random.seed(0), np.random.seed(0)  # a random collator: the same batch each time
            batch = collator([copy.copy(dataset[i]) for i in rows])  # copies: a collator may pop keys
        _hash_value(digest := hashlib.sha256(json.dumps(rows).encode()), batch)
    except Exception as error:  # any collator error: the cache falls back to the names, the run goes on
        logger.warning("the feature cache identifies the collator by its class names only: it failed on the probe "
                       "(%s: %s)", type(error).__name__, error)
        return f"collate failed on the probe ({type(error).__name__}): identified by class names only"
    finally:
        random.setstate(python_state), np.random.set_state(numpy_state)
    return digest.hexdigest()


def _hash_value(digest: Any, value: Any) -> None:
    """Feed `value` (a batch: mappings, sequences, tensors, arrays, scalars) into `digest`, structure included."""
    if isinstance(value, torch.Tensor):
        digest.update(f"tensor|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray) and value.dtype != object:
        digest.update(f"array|{value.dtype.str}|{value.shape}|".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (Mapping, list, tuple, np.ndarray)):  # a mapping by its sorted keys
        digest.update(f"{type(value).__name__}|{len(value)}|".encode())
        for key in sorted(value, key=str) if isinstance(value, Mapping) else range(len(value)):
            digest.update(f"{key}=".encode())
            _hash_value(digest, value[key])
    elif value is None or isinstance(value, (str, int, float, bool, np.generic)):
        digest.update(f"{type(value).__name__}|{value!r}|".encode())
    else:  # an object whose text may hold a memory address: its type only
        digest.update(f"object|{type(value).__module__}.{type(value).__qualname__}|".encode())


def array_record(array: np.ndarray) -> dict:
    """The manifest's record of a C-contiguous array: `shape`, `dtype`, `finite` (every value of a float array is
    finite) and `sha256` of all its bytes, read in `CHUNK_BYTES` chunks (about 1 s per GB)."""
    data, digest, finite = array.reshape(-1).view(np.uint8), hashlib.sha256(), True
    for start in range(0, data.size, CHUNK_BYTES):
        chunk = data[start:start + CHUNK_BYTES]
        digest.update(memoryview(chunk))
        if np.issubdtype(array.dtype, np.inexact):
            finite = finite and bool(np.isfinite(chunk.view(array.dtype)).all())
    return {"shape": list(array.shape), "dtype": array.dtype.str, "finite": finite, "sha256": digest.hexdigest()}


def check_arrays(arrays: dict[str, np.ndarray], n_examples: int | None = None) -> str | None:
    """What is wrong with a set of cache arrays, or `None`: `features` float `[n_examples, dim]` (one row per example
    of the identity's data when `n_examples` is given), `loss_tokens` `[n_examples]` integer >= 0 with one > 0,
    when present `norms` / `losses` `[n_examples]` and `inputs` float `[n_examples, r]` (noise filter)."""
    if "features" not in arrays or "loss_tokens" not in arrays:
        return "features or loss_tokens is missing"
    features, loss_tokens = arrays["features"], arrays["loss_tokens"]
    n = features.shape[0] if features.ndim else -1
    for name in ("features", "inputs"):
        if name in arrays and (arrays[name].ndim != 2 or not np.issubdtype(arrays[name].dtype, np.floating)
                               or arrays[name].shape[0] != n):
            return f"{name} is {arrays[name].dtype} of shape {list(arrays[name].shape)}, not float [n_examples, dim]"
    if n_examples is not None and n != n_examples:
        return f"features has {n} rows for {n_examples} examples"
    wrong = [name for name in ("loss_tokens", "norms", "losses") if name in arrays and arrays[name].shape != (n,)]
    if wrong:
        return f"{wrong[0]} has shape {list(arrays[wrong[0]].shape)}, not [{n}]"
    if not np.issubdtype(loss_tokens.dtype, np.integer) or (loss_tokens < 0).any():
        return f"loss_tokens is not a count >= 0 ({loss_tokens.dtype}, negative values: {(loss_tokens < 0).any()})"
    return None if (loss_tokens > 0).any() else "loss_tokens counts no loss-bearing token"


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
        """The cached arrays (`features` `[n_examples, dim]` memory-mapped copy-on-write, `loss_tokens`, and `norms`,
        `losses`, `inputs` when stored), checked; `None` on a miss or a bad entry (logged once and removed)."""
        self.remove_stale_staging()
        folder = self.path(identity)
        if not os.path.isdir(folder):
            return None
        arrays, problem = self._read(folder, identity)
        if problem is None:
            return arrays
        shutil.rmtree(folder, ignore_errors=True)
        logger.warning("bad feature-cache entry %s: %s; %s, the features are computed again", folder, problem,
                       "could not remove it" if os.path.exists(folder) else "removed it")
        return None

    def _read(self, folder: str, identity: dict) -> tuple[dict | None, str | None]:
        """`(arrays, None)` for a sound entry, `(None, what is wrong)` otherwise."""
        try:
            stored, manifest = self._metadata(folder)
            records = manifest["arrays"]
            names = [name for name in ARRAYS if name in records]
            if any(set(records[name]) != {"shape", "dtype", "finite", "sha256"} for name in names):
                raise ValueError("an array's record is not its shape, dtype, finite and sha256")
        except FileNotFoundError as error:
            return None, f"{os.path.basename(error.filename)} is missing"
        except (OSError, ValueError, KeyError, TypeError) as error:
            return None, f"unreadable metadata ({type(error).__name__}: {error})"
        if stored != json.loads(json.dumps(identity, sort_keys=True, default=str)):
            return None, "identity.json does not match the key"
        arrays = {}
        for name in names:
            try:  # np.load raises EOFError (0 bytes), ValueError (truncated), OSError, ...
                arrays[name] = np.load(os.path.join(folder, name + ".npy"), allow_pickle=False,
                                       mmap_mode="c" if name == "features" else None)
            except Exception as error:
                return None, f"{name}.npy is unreadable ({type(error).__name__}: {error})"
            array, record = arrays[name], records[name]
            if [list(array.shape), array.dtype.str] != [record["shape"], record["dtype"]]:
                return None, (f"{name}.npy holds {array.dtype.str} {list(array.shape)}, the manifest says "
                              f"{record['dtype']} {record['shape']}")
        problem = check_arrays(arrays, identity.get("n_examples"))
        for name in names if problem is None else ():
            found = array_record(np.ascontiguousarray(arrays[name]))
            if records[name]["finite"] and not found["finite"]:
                problem = f"{name} holds NaN or inf"
            elif found["sha256"] != records[name]["sha256"]:
                problem = f"{name}.npy does not match its checksum"
        return (None, problem) if problem else (arrays, None)

    @staticmethod
    def _metadata(folder: str) -> tuple[dict, dict]:
        """`(identity, manifest)` of an entry folder. Raises OSError, ValueError (not JSON)."""
        with open(os.path.join(folder, "identity.json"), encoding="utf-8") as identity, \
                open(os.path.join(folder, MANIFEST), encoding="utf-8") as manifest:
            return json.load(identity), json.load(manifest)

    def save(self, identity: dict, arrays: dict[str, np.ndarray | None]) -> str:
        """Store `arrays` (the names of `load`; `None` values are left out) with their identity and manifest; returns
        the folder. A sound existing entry of the same key holding every array given is kept; a bad one, or one
        without an array given here (an older version's, without a truncated pass's `losses`), is replaced.

        Raises:
            ValueError: if the arrays fail `check_arrays` (a bad entry). OSError: if the folder cannot be written.
        """
        arrays = {name: np.ascontiguousarray(value) for name, value in arrays.items() if value is not None}
        if (problem := check_arrays(arrays, identity.get("n_examples"))) is not None:
            raise ValueError(f"not storing these features in the cache: {problem}.")
        self.remove_stale_staging()
        folder = self.path(identity)
        stored, problem = self._read(folder, identity) if os.path.isdir(folder) else (None, "none")
        if problem is None and set(arrays) <= set(stored):
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # a bad entry, if any
        os.makedirs(self.directory, exist_ok=True)
        staging = tempfile.mkdtemp(dir=self.directory, prefix=STAGING_PREFIX)
        try:
            for name, array in arrays.items():
                np.save(os.path.join(staging, name + ".npy"), array)
            with open(os.path.join(staging, "identity.json"), "w", encoding="utf-8") as handle:
                json.dump(identity, handle, indent=2, sort_keys=True, default=str)
            with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as handle:
                json.dump({"created": time.time(), "arrays": {name: array_record(array) for name, array in
                                                              arrays.items()}}, handle, indent=2, sort_keys=True)
            os.replace(staging, folder)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not os.path.isdir(folder):
                raise
        return folder

    def remove_stale_staging(self) -> None:
        """Remove the `.staging-*` folders of killed writes: those nothing has written to for `STALE_STAGING_SECONDS`
        (newest change time of the folder and its files; a write in progress keeps touching them)."""
        for path in self._paths(re.escape(STAGING_PREFIX) + ".*"):
            try:
                newest = max(os.path.getmtime(p) for p in [path] + [os.path.join(path, f) for f in os.listdir(path)])
            except OSError:  # gone meanwhile, or not a folder
                continue
            if time.time() - newest > STALE_STAGING_SECONDS:
                shutil.rmtree(path, ignore_errors=True)

    def _paths(self, pattern: str) -> list[str]:
        """Sorted paths of the names in the folder that match `pattern` (none without a folder)."""
        names = os.listdir(self.directory) if os.path.isdir(self.directory) else []
        return sorted(os.path.join(self.directory, n) for n in names if re.fullmatch(pattern, n))

    def keys(self) -> list[str]:
        """The keys of the entries in the folder, sorted (the folders named like a key)."""
        return [os.path.basename(p) for p in self._paths(KEY_PATTERN) if os.path.isdir(p)]

    def entries(self) -> list[dict]:
        """One dict per entry, oldest first, from its metadata (the arrays are checked by `load`, not here): `key`,
        `size_bytes` (its files), `created` (Unix seconds), `n_examples`, `dim`, `model` and `data` (the weights
        digest and the data fingerprint, first 12 hex digits) and `problem` (`None`, or why the metadata is bad)."""
        self.remove_stale_staging()
        found = []
        for key in self.keys():
            path = os.path.join(self.directory, key)
            entry = dict(key=key, size_bytes=sum(f.stat().st_size for f in os.scandir(path) if f.is_file()),
                         created=os.path.getmtime(path), n_examples=None, dim=None, model=None, data=None, problem=None)
            try:
                identity, manifest = self._metadata(path)
                n_examples, dim = manifest["arrays"]["features"]["shape"]
                entry.update(created=float(manifest["created"]), n_examples=n_examples, dim=dim,
                             model=str(identity.get("weights"))[:12], data=str(identity.get("data"))[:12])
            except (OSError, ValueError, KeyError, TypeError) as error:  # damaged, or an earlier version's entry
                entry["problem"] = f"unreadable metadata ({type(error).__name__}: {error})"
            found.append(entry)
        return sorted(found, key=lambda e: (e["created"], e["key"]))

    def clear(self, key: str | None = None) -> list[str]:
        """Remove every entry and the stale staging folders, or the one entry `key` (its key, or a prefix only it
        starts with); only folders named like a key are touched. Returns the removed keys.

        Raises:
            ValueError: if `key` is not hexadecimal, or names no entry or several. OSError: if one cannot be removed.
        """
        self.remove_stale_staging()
        if key is not None and not re.fullmatch(r"[0-9a-f]{1,40}", key):
            raise ValueError(f"`key` must be an entry's hexadecimal key, got {key!r}.")
        keys = [k for k in self.keys() if k.startswith(key or "")]
        if key is not None and len(keys) != 1:
            raise ValueError(f"{f'{len(keys)} entries' if keys else 'no entry'} of the feature cache {self.directory} "
                             f"match{'' if keys else 'es'} {key!r}.")
        for k in keys:
            shutil.rmtree(os.path.join(self.directory, k))
        return keys
