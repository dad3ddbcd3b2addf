"""Shared fixtures: a tiny causal LM built from config, a tokenizer trained locally, small datasets. No network."""

from __future__ import annotations

import copy
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_assets  # noqa: E402


@pytest.fixture(autouse=True)
def _private_feature_cache(tmp_path_factory, monkeypatch):
    """Each test gets an empty feature cache (never the user's ~/.cache): a hit only within one test."""
    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(tmp_path_factory.mktemp("feature-cache")))


@pytest.fixture(scope="session")
def tokenizer():
    """A WordLevel tokenizer trained locally, with distinct pad / eos tokens."""
    return tiny_assets.build_tokenizer()


@pytest.fixture(scope="session")
def _tiny_lm_base(tokenizer):
    return tiny_assets.build_model(tokenizer)


@pytest.fixture
def tiny_lm(_tiny_lm_base):
    """A fresh deep copy of a 2-layer, hidden-32 Llama per test."""
    return copy.deepcopy(_tiny_lm_base)


@pytest.fixture(scope="session")
def lm_dataset(tokenizer):
    """96 tokenized examples (`input_ids`, `attention_mask`, `labels` with the first two tokens masked)."""
    return tiny_assets.build_dataset(tokenizer)


@pytest.fixture(scope="session")
def collator(tokenizer):
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


@pytest.fixture
def two_level_calls(monkeypatch):
    """Every call of `sampled.two_level_kmeans` from now on, as `(depth, n_clusters)`: depth 0 for a call from
    outside it, 1 for its own recursion (a third level), and so on."""
    from hf_cluster_select.selection import sampled

    calls, depth = [], [0]
    original = sampled.two_level_kmeans

    def counting(*args, **kwargs):
        calls.append((depth[0], args[2]))
        depth[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(sampled, "two_level_kmeans", counting)
    return calls
