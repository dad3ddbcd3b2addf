"""The feature cache: a second run on the same identity loads the features; any change of a key part recomputes."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import tiny_assets
import torch
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.feature_cache import FeatureCache, feature_identity, weights_digest
from hf_cluster_select.features import FEATURES
from hf_cluster_select.persistence import data_fingerprint
from hf_cluster_select.run import resolve_run_facts


def _counting_feature(monkeypatch) -> list:
    calls = []
    name = "hidden_mean"  # feature="auto" on a language model
    original = FEATURES.get(name)
    monkeypatch.setitem(FEATURES._entries, name, lambda model, *a, **k: (calls.append(1), original(model, *a, **k))[1])
    return calls


def _trainer(folder, model, dataset, collator, tokenizer=None, **config):
    args = TrainingArguments(output_dir=str(folder), per_device_train_batch_size=4, num_train_epochs=1, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=0, seed=0)
    return ClusterTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                          processing_class=tokenizer,
                          cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0, **config))


def test_second_run_loads_the_features_and_selects_the_same(tmp_path, tiny_lm, lm_dataset, collator, tokenizer,
                                                            monkeypatch):
    calls = _counting_feature(monkeypatch)
    first = _trainer(tmp_path / "a", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer)
    first.train()
    second = _trainer(tmp_path / "b", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer)
    second.train()
    assert calls == [1]  # one feature pass for two runs
    assert first.selection_report.features_from_cache is False and second.selection_report.features_from_cache is True
    np.testing.assert_array_equal(first.selection.indices, second.selection.indices)
    np.testing.assert_array_equal(first.selection.weights, second.selection.weights)
    entries = [e for e in os.listdir(os.environ["HF_CLUSTER_SELECT_CACHE"]) if not e.startswith(".")]
    assert len(entries) == 1 and sorted(os.listdir(os.path.join(os.environ["HF_CLUSTER_SELECT_CACHE"], entries[0]))) \
        == ["features.npy", "identity.json", "loss_tokens.npy", "norms.npy"]  # no losses: a truncated pass (auto)
    third = _trainer(tmp_path / "c", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer, feature_cache=False)
    third.train()
    assert calls == [1, 1] and third.selection_report.features_from_cache is False


def test_a_changed_warm_up_recomputes(tmp_path, tiny_lm, lm_dataset, collator, tokenizer, monkeypatch):
    """The weights are hashed after the warm-up: one more warm-up step is another model."""
    calls = _counting_feature(monkeypatch)
    _trainer(tmp_path / "a", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer).train()
    trainer = _trainer(tmp_path / "b", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer)
    trainer.cluster_config.selection_warmup_steps = 1
    trainer.train()
    assert calls == [1, 1] and trainer.selection_report.features_from_cache is False


def test_another_attention_mask_recomputes(tmp_path, tiny_lm, lm_dataset, collator, tokenizer, monkeypatch):
    """Every input column is part of the data's identity: the same tokens and labels with another attention mask
    are other features."""
    calls = _counting_feature(monkeypatch)
    _trainer(tmp_path / "a", copy.deepcopy(tiny_lm), lm_dataset, collator, tokenizer).train()
    masked = lm_dataset.map(lambda row: {"attention_mask": [1] * (len(row["attention_mask"]) - 1) + [0]})
    trainer = _trainer(tmp_path / "b", copy.deepcopy(tiny_lm), masked, collator, tokenizer)
    trainer.train()
    assert calls == [1, 1] and trainer.selection_report.features_from_cache is False


def _identity(model, dataset, config=None, collator="c", tokenizer=None, shift=True):
    fingerprint = data_fingerprint([len(x["input_ids"]) for x in dataset],
                                   str(hash(tuple(tuple(x["input_ids"]) for x in dataset))))
    config = config or ClusterSelectConfig()
    facts = resolve_run_facts(model, config, shift_labels=shift)
    return feature_identity(model, config, facts, data_fingerprint=fingerprint, collator=collator, tokenizer=tokenizer)


def test_every_key_part_changes_the_key(tiny_lm, lm_dataset, tokenizer):
    base = FeatureCache.key(_identity(tiny_lm, lm_dataset, tokenizer=tokenizer))
    assert FeatureCache.key(_identity(copy.deepcopy(tiny_lm), lm_dataset, tokenizer=tokenizer)) == base  # a copy hits
    one_token = [dict(x) for x in lm_dataset]
    one_token[5]["input_ids"] = list(one_token[5]["input_ids"][:-1]) + [one_token[5]["input_ids"][-1] + 1]
    moved = copy.deepcopy(tiny_lm)
    with torch.no_grad():  # a single weight
        moved.model.layers[1].mlp.down_proj.weight[3, 7] += 1e-3
    other_tokenizer = tiny_assets.build_tokenizer()
    other_tokenizer.add_tokens(["zzz-new"])
    variants = {
        "data": _identity(tiny_lm, one_token, tokenizer=tokenizer),
        "weights": _identity(moved, lm_dataset, tokenizer=tokenizer),
        "tokenizer": _identity(tiny_lm, lm_dataset, tokenizer=other_tokenizer),
        "feature": _identity(tiny_lm, lm_dataset, ClusterSelectConfig(feature="hidden_mean"), tokenizer=tokenizer),
        "projection": _identity(tiny_lm, lm_dataset, ClusterSelectConfig(strategy_kwargs={"projection_dim": 8}), tokenizer=tokenizer),
        "layers": _identity(tiny_lm, lm_dataset, ClusterSelectConfig(strategy_kwargs={"feature_layers": 1}), tokenizer=tokenizer),
        "seed": _identity(tiny_lm, lm_dataset, ClusterSelectConfig(selection_seed=1), tokenizer=tokenizer),
        "collator": _identity(tiny_lm, lm_dataset, collator=3, tokenizer=tokenizer),
        "shift": _identity(tiny_lm, lm_dataset, tokenizer=tokenizer, shift=False),
    }
    keys = {name: FeatureCache.key(identity) for name, identity in variants.items()}
    assert base not in keys.values() and len(set(keys.values())) == len(keys)
    # settings that do not change features share the entry
    same = _identity(tiny_lm, lm_dataset, ClusterSelectConfig(data_fraction=0.1, within_cluster="random",
                                                              cluster_method="hdbscan"), tokenizer=tokenizer)
    assert FeatureCache.key(same) == base


def test_store_load_and_unreadable_entries(tmp_path):
    cache = FeatureCache(str(tmp_path))
    identity = {"data": "x", "weights": "y"}
    assert cache.load(identity) is None
    features = np.arange(12, dtype=np.float32).reshape(4, 3)
    folder = cache.save(identity, {"features": features, "loss_tokens": np.array([1, 2, 0, 3]), "norms": None})
    loaded = cache.load(identity)
    assert sorted(loaded) == ["features", "loss_tokens"] and isinstance(loaded["features"], np.memmap)
    np.testing.assert_array_equal(loaded["features"], features)
    np.testing.assert_array_equal(loaded["loss_tokens"], [1, 2, 0, 3])
    loaded["features"][0, 0] = 99.0  # copy-on-write: the stored entry is not changed
    assert cache.load(identity)["features"][0, 0] == 0.0
    with open(os.path.join(folder, "features.npy"), "wb") as handle:
        handle.write(b"not an array")
    assert cache.load(identity) is None  # an unreadable entry is a miss, not an error
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".staging")]


def test_partitioned_weights_turn_the_cache_off():
    model = torch.nn.Linear(3, 2)
    assert weights_digest(model) is not None
    model.weight = torch.nn.Parameter(torch.empty(0))  # DeepSpeed ZeRO-3 leaves an empty local tensor
    assert weights_digest(model) is None
    assert feature_identity(model, ClusterSelectConfig(), tiny_assets.run_facts(), data_fingerprint="d") is None


def test_config_field_is_checked():
    with pytest.raises(TypeError, match="feature_cache"):
        ClusterSelectConfig(feature_cache="yes")
