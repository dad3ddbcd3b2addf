"""Cheaper or given inputs: the first k blocks (`feature_layers`), `feature_model=`, and `selection=` (reuse)."""

from __future__ import annotations

import copy

import numpy as np

import pytest
import tiny_assets
import torch
from transformers import LlamaForCausalLM, TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.features import FEATURES, badge_features
from hf_cluster_select.features.proxy import find_layer_list, truncated_layers


def deep_lm(tokenizer, layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_assets.llama_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                     num_hidden_layers=layers)).eval()


def test_truncated_layers_equal_a_shallow_model(tokenizer, lm_dataset, collator):
    """Features of the first 2 of 4 blocks equal those of a 2-block model holding the same weights (the same final
    norm and head), and the model has all 4 blocks again afterwards."""
    deep = deep_lm(tokenizer)
    shallow = LlamaForCausalLM(tiny_assets.llama_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                        num_hidden_layers=2)).eval()
    missing = shallow.load_state_dict(deep.state_dict(), strict=False)
    assert not missing.missing_keys  # layers 2-3 of `deep` are the only extra keys
    rows = list(range(12))
    with truncated_layers(deep, 2):
        assert len(find_layer_list(deep)[2]) == 2
        ours = badge_features(deep, lm_dataset, rows, collator, batch_size=4, show_progress=False)
    theirs = badge_features(shallow, lm_dataset, rows, collator, batch_size=4, show_progress=False)
    assert torch.allclose(ours.features, theirs.features, atol=1e-5)
    assert torch.allclose(ours.losses, theirs.losses, atol=1e-5)
    assert len(find_layer_list(deep)[2]) == 4
    full = badge_features(deep, lm_dataset, rows, collator, batch_size=4, show_progress=False)
    assert not torch.allclose(full.features, ours.features, atol=1e-3)


def test_truncated_layers_restores_after_an_error_and_checks(tokenizer):
    deep = deep_lm(tokenizer)
    with pytest.raises(RuntimeError, match="boom"):
        with truncated_layers(deep, 1):
            raise RuntimeError("boom")
    assert len(deep.model.layers) == 4
    with pytest.warns(UserWarning, match="not below the model's depth"):
        with truncated_layers(deep, 9) as same:  # more than there are: unchanged
            assert len(same.model.layers) == 4
    with pytest.raises(ValueError, match="feature_layers"):
        with truncated_layers(deep, 0):
            pass
    with pytest.raises(ValueError, match="feature_layers"):
        ClusterSelectConfig(strategy_kwargs={"feature_layers": 0})


def test_truncated_layers_cut_both_stacks_of_an_encoder_decoder():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=3,
                                                num_decoder_layers=3, num_heads=2))
    with truncated_layers(model, 1):
        assert len(model.encoder.block) == 1 and len(model.decoder.block) == 1
    assert len(model.encoder.block) == 3 and len(model.decoder.block) == 3


def _trainer(tmp_path, model, lm_dataset, collator, **kwargs):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=0)
    return ClusterTrainer(model=model, args=args, train_dataset=lm_dataset, data_collator=collator,
                          cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0), **kwargs)


def test_feature_model_is_the_one_features_come_from(tmp_path, tokenizer, tiny_lm, lm_dataset, collator,
                                                     monkeypatch):
    """`feature_model=` (a module, or a saved folder) is what the feature signal receives; the trained model is
    trained on the selection."""
    seen = []
    name = "hidden_mean"  # feature="auto" on a language model
    original = FEATURES.get(name)
    monkeypatch.setitem(FEATURES._entries, name, lambda model, *a, **k: (seen.append(model), original(model, *a, **k))[1])
    proxy = deep_lm(tokenizer, layers=1)
    trainer = _trainer(tmp_path / "a", tiny_lm, lm_dataset, collator, feature_model=proxy)
    trainer.train()
    assert seen == [proxy] and trainer.selection.n_kept == 48
    proxy.save_pretrained(tmp_path / "proxy")
    trainer = _trainer(tmp_path / "b", copy.deepcopy(tiny_lm), lm_dataset, collator,
                       feature_model=str(tmp_path / "proxy"))
    assert isinstance(trainer.feature_model, LlamaForCausalLM)
    assert len(trainer.feature_model.model.layers) == 1 and not trainer.feature_model.training


def test_feature_model_errors(tmp_path, tokenizer, tiny_lm, lm_dataset, collator):
    with pytest.raises(ValueError, match="config.json"):
        _trainer(tmp_path, tiny_lm, lm_dataset, collator, feature_model=str(tmp_path / "missing"))
    with pytest.raises(TypeError, match="feature_model"):
        _trainer(tmp_path, tiny_lm, lm_dataset, collator, feature_model=3)
    small_vocab = LlamaForCausalLM(tiny_assets.llama_config(8, num_hidden_layers=1))
    with pytest.raises(ValueError, match="share the tokenizer"):
        _trainer(tmp_path, tiny_lm, lm_dataset, collator, feature_model=small_vocab)
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    classifier = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32, num_labels=3))
    with pytest.raises(ValueError, match="another kind of output head"):
        _trainer(tmp_path, tiny_lm, lm_dataset, collator, feature_model=classifier)
    # a folder of another architecture loads as itself (AutoModelForCausalLM), not as the trained model's class
    GPT2LMHeadModel(GPT2Config(vocab_size=tiny_lm.config.vocab_size, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "gpt2")
    trainer = _trainer(tmp_path, tiny_lm, lm_dataset, collator, feature_model=str(tmp_path / "gpt2"))
    assert type(trainer.feature_model).__name__ == "GPT2LMHeadModel"
    other_labels = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                            num_attention_heads=2, intermediate_size=32, num_labels=2))
    with pytest.raises(ValueError, match="2 labels, the trained model 3"):
        ClusterTrainer(model=classifier, args=TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True),
                       train_dataset=lm_dataset, feature_model=other_labels)


def test_feature_layers_in_a_training_run(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    """`ClusterSelectConfig(feature_layers=1)`: the feature pass sees 1 of the 2 blocks; training uses both."""
    depth = []
    name = "hidden_mean"  # feature="auto" on a language model
    original = FEATURES.get(name)
    monkeypatch.setitem(FEATURES._entries, name,
                        lambda model, *a, **k: (depth.append(len(model.model.layers)), original(model, *a, **k))[1])
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=0)
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0, strategy_kwargs={"feature_layers": 1}))
    trainer.train()
    assert depth == [1] and len(trainer.model.model.layers) == 2



def test_train_on_a_saved_selection(tmp_path, tokenizer, tiny_lm, lm_dataset, collator, monkeypatch):
    """`ClusterTrainer(selection=folder)` trains another model on a saved selection: no warm-up, no feature pass,
    the same kept indices and weights; other data or other selection settings are refused by name."""
    first = _trainer(tmp_path / "a", tiny_lm, lm_dataset, collator)
    first.train()
    folder = str(tmp_path / "a")
    assert (tmp_path / "a" / "cluster_selection.npz").is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("no feature pass when a selection is given")

    monkeypatch.setitem(FEATURES._entries, "hidden_mean", refuse)  # feature="auto" on a language model
    other_model = deep_lm(tokenizer, layers=3)
    args = TrainingArguments(output_dir=str(tmp_path / "b"), per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=2)
    second = ClusterTrainer(model=other_model, args=args, train_dataset=lm_dataset, data_collator=collator,
                            selection=folder)
    second.train()
    assert np.array_equal(second.selection.indices, first.selection.indices)
    assert np.array_equal(second.selection.weights, first.selection.weights)
    assert second.step_plan.warmup_steps == 0 and second.state.global_step == second.step_plan.total_steps == 12
    assert second.selection_report.features_seconds == 0.0
    with pytest.raises(ValueError, match=r"data_fraction: 0\.5 in the checkpoint, 0\.25 now"):
        ClusterTrainer(model=other_model, args=args, train_dataset=lm_dataset, data_collator=collator,
                       selection=folder, cluster_config=ClusterSelectConfig(data_fraction=0.25)).train()
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        ClusterTrainer(model=other_model, args=args, train_dataset=lm_dataset.select(range(95, -1, -1)),
                       data_collator=collator, selection=folder).train()
    with pytest.raises(ValueError, match="no cluster_selection.npz"):
        ClusterTrainer(model=other_model, args=args, train_dataset=lm_dataset, selection=str(tmp_path / "empty"))
    with pytest.raises(TypeError, match="`selection` must be"):
        ClusterTrainer(model=other_model, args=args, train_dataset=lm_dataset, selection=3)


def test_a_loss_rule_on_a_truncated_pass_warns_and_selects_as_facility_location(tmp_path, tiny_lm, lm_dataset,
                                                                                 collator, caplog):
    """feature="auto" on a language model runs a truncated pass that keeps no losses: `drop_loss_outliers` says so
    and keeps exactly what `facility_location` keeps."""
    import copy
    import logging

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=0)
    kept = {}
    for rule in ("drop_loss_outliers", "facility_location"):
        trainer = ClusterTrainer(model=copy.deepcopy(tiny_lm), args=args, train_dataset=lm_dataset,
                                 data_collator=collator,
                                 cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0,
                                                                    within_cluster=rule, feature_cache=False,
                                                                    strategy_kwargs={"feature_layers": 1}))
        with caplog.at_level(logging.WARNING, logger="hf_cluster_select.pipeline"):
            trainer.train()
        kept[rule] = trainer.selection.indices.tolist()
        assert ("needs per-example losses" in caplog.text) == (rule == "drop_loss_outliers")
        caplog.clear()
    assert kept["drop_loss_outliers"] == kept["facility_location"] and len(kept["facility_location"]) > 0
