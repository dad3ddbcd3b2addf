"""The feature cache: a second run on the same identity loads the features; any change of a key part recomputes."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time

import numpy as np
import pytest
import tiny_assets
import torch
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select import feature_cache
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
        == ["features.npy", "identity.json", "loss_tokens.npy", "losses.npy", "manifest.json", "norms.npy"]
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


# ---- entries that check themselves (issue 20) ------------------------------------------------------------------
def _pass(model, dataset, collator, tokenizer, cache, order="shuffled", inputs=None):
    """One run of the pipeline's feature step (`cached_or_computed_features`) on the tiny LM: `(features,
    loss_tokens, from_cache, identity)`; with a list `inputs`, the input states are asked for and appended to it."""
    from hf_cluster_select.pipeline import cached_or_computed_features

    config = ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0, order=order)
    facts = resolve_run_facts(model, config, shift_labels=True)
    lengths = [len(x["input_ids"]) for x in dataset]
    identity = feature_identity(model, config, facts, data_fingerprint=data_fingerprint(lengths, "t"),
                                collator=collator, tokenizer=tokenizer, probe=dataset)
    features, loss_tokens, _, _, states, from_cache = cached_or_computed_features(
        model, dataset, collator, config=config, facts=facts, lengths=lengths, batch_size=8, show_progress=False,
        cache=cache, identity=identity, input_states=inputs is not None)
    if inputs is not None:
        inputs.append(states)
    else:
        assert states is None
    return np.asarray(features), loss_tokens, from_cache, identity


def _flip_bytes(path):
    data = bytearray(open(path, "rb").read())
    for i in range(len(data) - 256, len(data)):  # the last 64 float32 values, header untouched: same size
        data[i] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _truncate(path, fraction):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:int(len(data) * fraction)])


CORRUPTIONS = {
    "empty_features": (lambda d: _truncate(os.path.join(d, "features.npy"), 0.0), "features.npy is unreadable"),
    "garbled_features": (lambda d: _flip_bytes(os.path.join(d, "features.npy")), "features"),
    "wrong_shape": (lambda d: np.save(os.path.join(d, "features.npy"),
                                      np.load(os.path.join(d, "features.npy"))[:10]), "the manifest says"),
    "zeroed_loss_tokens": (lambda d: np.save(os.path.join(d, "loss_tokens.npy"),
                                             np.zeros_like(np.load(os.path.join(d, "loss_tokens.npy")))),
                           "loss_tokens counts no loss-bearing token"),
    "truncated_features": (lambda d: _truncate(os.path.join(d, "features.npy"), 0.6), "features.npy is unreadable"),
    "unreadable_manifest": (lambda d: open(os.path.join(d, "manifest.json"), "w").write("{not json"),
                            "unreadable metadata"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_bad_entry_costs_one_recompute_once(corruption, tmp_path, tiny_lm, lm_dataset, collator, tokenizer,
                                              monkeypatch, caplog):
    calls = _counting_feature(monkeypatch)
    cache = FeatureCache(str(tmp_path))
    fresh, loss_tokens, from_cache, identity = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)
    assert calls == [1] and from_cache is False
    folder = cache.path(identity)
    damage, reason = CORRUPTIONS[corruption]
    damage(folder)
    caplog.set_level("WARNING", logger="hf_cluster_select.feature_cache")
    again, again_tokens, from_cache, _ = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)  # recomputed
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and folder in warnings[0].getMessage() and reason in warnings[0].getMessage()
    assert "removed it" in warnings[0].getMessage()
    assert calls == [1, 1] and from_cache is False
    np.testing.assert_array_equal(again, fresh)
    third, third_tokens, from_cache, _ = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)  # the new entry hits
    assert calls == [1, 1] and from_cache is True and len(caplog.records) == 1
    np.testing.assert_array_equal(third, fresh)
    np.testing.assert_array_equal(third_tokens, loss_tokens)
    assert cache.keys() == [os.path.basename(folder)]


def test_an_entry_without_the_truncated_pass_losses_is_computed_again_for_the_curriculum(
        tmp_path, tiny_lm, lm_dataset, collator, tokenizer, monkeypatch):
    """Older versions stored no `losses` for a truncated pass (the default LM feature): `order="shuffled"` loads
    such an entry as it is; `"easy_to_hard"` orders by those losses, so it computes them once and replaces it. The
    order is not part of the identity."""
    import shutil

    calls = _counting_feature(monkeypatch)
    cache = FeatureCache(str(tmp_path))
    fresh, _, _, identity = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)
    arrays = {k: np.array(v) for k, v in cache.load(identity).items()}
    assert calls == [1] and sorted(arrays) == ["features", "loss_tokens", "losses", "norms"]
    shutil.rmtree(cache.path(identity))
    cache.save(identity, {k: v for k, v in arrays.items() if k != "losses"})  # an older version's entry
    assert _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)[2:] == (True, identity) and calls == [1]
    again, _, from_cache, same = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache, order="easy_to_hard")
    assert (from_cache, same, calls) == (False, identity, [1, 1])
    np.testing.assert_array_equal(again, fresh)
    np.testing.assert_array_equal(np.load(os.path.join(cache.path(identity), "losses.npy")), arrays["losses"])
    assert _pass(tiny_lm, lm_dataset, collator, tokenizer, cache, order="easy_to_hard")[2] is True and calls == [1, 1]


def test_the_noise_filters_input_states_are_cached_with_the_features(tmp_path, tiny_lm, lm_dataset, collator,
                                                                     tokenizer, monkeypatch):
    """An entry stored without input states (`noise_share=0`) is a miss for the noise filter: computed once more with
    them and stored over; then both kinds of run hit it, and the filter gets the stored states back."""
    calls = _counting_feature(monkeypatch)
    cache = FeatureCache(str(tmp_path))
    fresh, _, _, identity = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)
    assert calls == [1] and "inputs" not in cache.load(identity)
    states = []
    again, _, from_cache, _ = _pass(tiny_lm, lm_dataset, collator, tokenizer, cache, inputs=states)
    assert (from_cache, calls) == (False, [1, 1]) and states[0].shape[0] == len(lm_dataset)
    np.testing.assert_array_equal(again, fresh)
    assert _pass(tiny_lm, lm_dataset, collator, tokenizer, cache, inputs=states)[2] is True and calls == [1, 1]
    np.testing.assert_array_equal(states[1], states[0])
    assert _pass(tiny_lm, lm_dataset, collator, tokenizer, cache)[2] is True and calls == [1, 1]


def test_load_removes_a_bad_entry_with_one_warning(tmp_path, caplog):
    cache = FeatureCache(str(tmp_path))
    identity = {"data": "x", "n_examples": 4}
    features = np.arange(12, dtype=np.float32).reshape(4, 3)
    folder = cache.save(identity, {"features": features, "loss_tokens": np.array([1, 2, 0, 3])})
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["arrays"]["features"] == {"shape": [4, 3], "dtype": "<f4", "finite": True,
                                              "sha256": hashlib.sha256(features.tobytes()).hexdigest()}
    np.save(os.path.join(folder, "features.npy"), np.full((4, 3), np.nan, dtype=np.float32))  # NaN, same size
    assert cache.load(identity) is None and not os.path.exists(folder)
    assert [r.getMessage() for r in caplog.records] == [
        f"bad feature-cache entry {folder}: features holds NaN or inf; removed it, the features are computed again"]
    with pytest.raises(ValueError, match="features has 3 rows for 4 examples"):  # never stores a bad entry
        cache.save(identity, {"features": features[:3], "loss_tokens": np.array([1, 2, 3])})
    with pytest.raises(ValueError, match="no loss-bearing token"):
        cache.save(identity, {"features": features, "loss_tokens": np.zeros(4, dtype=np.int64)})


def test_stale_staging_folders_are_removed(tmp_path):
    cache = FeatureCache(str(tmp_path))
    stale, live = tmp_path / ".staging-killed", tmp_path / ".staging-writing"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "features.npy").write_bytes(b"x" * 10)
    old = time.time() - feature_cache.STALE_STAGING_SECONDS - 60
    for path in (stale, stale / "features.npy"):
        os.utime(path, (old, old))
    os.utime(live, (old, old))  # an old folder whose file is still being written is kept
    assert cache.load({"data": "x"}) is None
    assert not stale.exists() and live.exists()
    os.utime(live / "features.npy", (old, old))
    cache.save({"data": "y"}, {"features": np.ones((2, 2), dtype=np.float32), "loss_tokens": np.array([1, 1])})
    assert not live.exists() and len(cache.keys()) == 1


def _three_entries(directory):
    cache = FeatureCache(str(directory))
    keys = []
    for n in (2, 3, 4):
        identity = {"data": f"data-{n}", "weights": f"weights-{n}", "n_examples": n}
        cache.save(identity, {"features": np.ones((n, 5), dtype=np.float32), "loss_tokens": np.ones(n, dtype=np.int64)})
        keys.append(FeatureCache.key(identity))
    return cache, keys


def test_list_and_clear_entries(tmp_path):
    cache, keys = _three_entries(tmp_path)
    (tmp_path / "not-an-entry").mkdir()  # other files and folders are neither listed nor removed
    entries = cache.entries()
    assert [e["key"] for e in entries] == keys
    assert [(e["n_examples"], e["dim"], e["model"], e["data"], e["problem"]) for e in entries] == [
        (n, 5, f"weights-{n}", f"data-{n}", None) for n in (2, 3, 4)]
    assert all(e["size_bytes"] == sum(os.path.getsize(f) for f in (tmp_path / e["key"]).iterdir()) for e in entries)
    assert all(abs(e["created"] - time.time()) < 60 for e in entries)
    assert cache.clear(keys[1][:10]) == [keys[1]] and cache.keys() == sorted([keys[0], keys[2]])
    with pytest.raises(ValueError, match="no entry"):
        cache.clear(keys[1])
    with pytest.raises(ValueError, match="hexadecimal"):
        cache.clear("../x")
    assert cache.clear() == sorted([keys[0], keys[2]]) and cache.entries() == []
    assert (tmp_path / "not-an-entry").is_dir()


def test_cache_command_lists_and_clears(tmp_path, capsys):
    from hf_cluster_select.commands import main

    _, keys = _three_entries(tmp_path)
    assert main(["cache", "list", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == keys and "4 x 5  model weights-4  data data-4" in lines[2]
    assert main(["cache", "clear", "--dir", str(tmp_path), keys[0]]) == 0
    assert capsys.readouterr().out == f"removed {keys[0]}\n"
    assert main(["cache", "clear", "--dir", str(tmp_path), keys[0]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-cluster-select cache clear: error: no entry") and len(err.splitlines()) == 1
    assert main(["cache", "list", "--dir", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"removed {k}" for k in sorted(keys[1:])]
    assert main(["cache", "list", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


# ---- an identity that covers what the collator does --------------------------------------------------------------
class MaskingCollator:
    """Wraps a collator and masks the labels of the first `masked` positions."""

    def __init__(self, collator, masked):
        self.collator, self.masked = collator, masked

    def __call__(self, rows):
        batch = self.collator(rows)
        batch["labels"][:, :self.masked] = -100
        return batch


def test_the_collator_is_identified_by_what_it_builds(tiny_lm, lm_dataset, collator, tmp_path):
    def identity(wrapped):
        return feature_identity(tiny_lm, ClusterSelectConfig(), resolve_run_facts(tiny_lm, ClusterSelectConfig(),
                                shift_labels=True), data_fingerprint="d", collator=wrapped, probe=lm_dataset)

    base = identity(MaskingCollator(collator, 3))
    cache = FeatureCache(str(tmp_path))
    cache.save(base, {"features": np.ones((len(lm_dataset), 2), dtype=np.float32),
                      "loss_tokens": np.ones(len(lm_dataset), dtype=np.int64)})
    other = identity(MaskingCollator(collator, 4))  # same classes, other labels: a miss
    assert FeatureCache.key(other) != FeatureCache.key(base) and cache.load(other) is None
    same = identity(MaskingCollator(collator, 3))  # another instance, same masking: a hit
    assert FeatureCache.key(same) == FeatureCache.key(base) and cache.load(same) is not None
    assert other["collator"] == base["collator"] == ["test_feature_cache.MaskingCollator",
                                                     "transformers.data.data_collator.DataCollatorForSeq2Seq"]
    assert base["n_examples"] == len(lm_dataset)


def test_a_collator_that_fails_on_the_probe_falls_back_to_its_names(tiny_lm, lm_dataset, caplog):
    def broken(rows):
        raise RuntimeError("no")

    identity = feature_identity(tiny_lm, ClusterSelectConfig(), resolve_run_facts(tiny_lm, ClusterSelectConfig(),
                                shift_labels=True), data_fingerprint="d", collator=broken, probe=lm_dataset)
    assert identity["collator_probe"] == "collate failed on the probe (RuntimeError): identified by class names only"
    assert "class names only" in caplog.text


def test_the_probe_is_repeatable_under_random_collators(lm_dataset, collator):
    def noisy(rows):  # draws random numbers: fixed seeds make the probe repeatable, the caller's state is kept
        batch = collator(rows)
        batch["noise"] = torch.rand(2)
        return batch

    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    first = feature_cache.collator_probe(noisy, lm_dataset)
    assert feature_cache.collator_probe(noisy, lm_dataset) == first and torch.rand(1) == expected
