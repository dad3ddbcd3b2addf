"""`feature="auto"` (the default): `hidden_mean` after 2/3 of the blocks for a language model, `badge` for a
classification head; what was computed is in the report and the card."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_assets
import torch
from transformers import BertConfig, BertForSequenceClassification, LlamaForCausalLM, TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.features import (describe_feature, effective_layers, feature_used, hidden_mean_features,
                                        resolve_feature)
from hf_cluster_select.features.proxy import truncated_layers
from hf_cluster_select.pipeline import cached_or_computed_features
from hf_cluster_select.run import resolve_run_facts


def lm(tokenizer, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_assets.llama_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                     num_hidden_layers=layers)).eval()


@pytest.mark.parametrize("layers, blocks", [(1, None), (2, 1), (3, 2), (4, 3), (6, 4), (30, 20)])
def test_auto_on_a_language_model_is_hidden_mean_after_two_thirds(tokenizer, layers, blocks):
    assert resolve_feature(lm(tokenizer, layers), "auto", None) == ("hidden_mean", blocks)


def test_auto_on_a_classifier_is_badge_and_explicit_settings_win(tokenizer):
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3,
                                                          num_attention_heads=2, intermediate_size=32,
                                                          num_labels=3)).eval()
    assert resolve_feature(classifier, "auto", None) == ("badge", None)
    assert resolve_feature(classifier, "auto", 2) == ("badge", 2)
    model = lm(tokenizer, 6)
    assert resolve_feature(model, "auto", 5) == ("hidden_mean", 5)
    assert resolve_feature(model, "badge", None) == ("badge", None)
    assert resolve_feature(model, "last_layer_grad", 2) == ("last_layer_grad", 2)
    assert describe_feature("hidden_mean", 4) == "hidden_mean after 4 blocks"
    assert describe_feature("hidden_mean", 1) == "hidden_mean after 1 block"
    assert describe_feature("badge", None) == "badge"
    assert ClusterSelectConfig().feature == "auto"


def test_default_features_are_hidden_mean_of_the_truncated_model(tokenizer, lm_dataset, collator):
    """The pipeline's default feature pass on a 3-block LM equals `hidden_mean` over its first 2 blocks, and
    differs from `hidden_mean` over all 3; its losses are the head's after 2 blocks (a logit-lens loss), not the
    model's."""
    model = lm(tokenizer, 3)
    n = 16
    lengths = [len(lm_dataset[i]["input_ids"]) for i in range(n)]
    default, hidden = ClusterSelectConfig(), ClusterSelectConfig(feature="hidden_mean")
    facts = resolve_run_facts(model, default, shift_labels=True)
    assert (facts.feature, facts.feature_layers, facts.feature_used) == ("hidden_mean", 2, "hidden_mean after 2 blocks")
    features, loss_tokens, norms, losses, _, from_cache = cached_or_computed_features(
        model, lm_dataset, collator, config=default, facts=facts, lengths=lengths, batch_size=4,
        show_progress=False, cache=None, identity=None)
    assert not from_cache and features.shape[0] == n and loss_tokens.shape == (n,) and norms.shape == (n,)
    _, _, _, full_losses, _, _ = cached_or_computed_features(
        model, lm_dataset, collator, config=hidden, facts=resolve_run_facts(model, hidden, shift_labels=True),
        lengths=lengths, batch_size=4, show_progress=False, cache=None, identity=None)
    assert full_losses.shape == (n,) and np.isfinite(full_losses).all() and (full_losses > 0).all()
    assert losses.shape == (n,) and np.isfinite(losses).all() and (losses > 0).all()  # the pass's own (logit lens)
    assert np.abs(losses - full_losses).max() > 1e-3  # not the model's: the selection pipeline keeps them for order
    with truncated_layers(model, 2):
        two = hidden_mean_features(model, lm_dataset, list(range(n)), collator, batch_size=4, lengths=lengths,
                                   show_progress=False, shift_labels=True).features.numpy()
    every = hidden_mean_features(model, lm_dataset, list(range(n)), collator, batch_size=4, lengths=lengths,
                                 show_progress=False, shift_labels=True).features.numpy()
    np.testing.assert_allclose(features, two, atol=1e-5)
    assert not np.allclose(features, every, atol=1e-3)
    assert len(model.model.layers) == 3


def test_a_truncated_pass_gives_the_order_its_loss_but_not_the_rules(tokenizer, lm_dataset, collator, monkeypatch):
    """`select_with_model` with the default truncated pass: the loss-based within-cluster rules get no losses (as
    before), the curriculum's difficulty is the pass's loss of each kept example."""
    from hf_cluster_select import pipeline
    from hf_cluster_select.clock import PhaseClock

    model, n = lm(tokenizer, 3), 32
    dataset = lm_dataset.select(range(n))
    lengths = [len(x["input_ids"]) for x in dataset]
    config = ClusterSelectConfig(data_fraction=0.5, order="easy_to_hard")
    facts = resolve_run_facts(model, config, shift_labels=True)
    given = []
    real = pipeline.select_subset
    monkeypatch.setattr(pipeline, "select_subset", lambda *a, **k: given.append(k["losses"]) or real(*a, **k))
    outcome = pipeline.select_with_model(model, dataset, collator, config=config, facts=facts, lengths=lengths,
                                         clock=PhaseClock(), batch_size=8, show_progress=False)
    assert given == [None] and outcome.losses is None
    _, _, _, losses, _, _ = cached_or_computed_features(model, dataset, collator, config=config, facts=facts,
                                                        lengths=lengths, batch_size=8, show_progress=False, cache=None,
                                                        identity=None)
    assert outcome.difficulty.shape == (16,)
    np.testing.assert_allclose(outcome.difficulty, losses[outcome.selection.indices], rtol=1e-6)


def test_report_and_card_name_the_feature_used(tokenizer, lm_dataset, collator, tmp_path):
    model = lm(tokenizer, 3)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=1,
                             use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True)
    trainer = ClusterTrainer(model=model, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0))
    trainer.train()
    assert trainer.selection_report.feature_used == "hidden_mean after 2 blocks"
    trainer.create_model_card()
    assert "| Feature | hidden_mean after 2 blocks |" in (tmp_path / "README.md").read_text()


def test_a_truncation_that_does_not_happen_is_not_reported(tokenizer):
    """`feature_layers` at or above the depth runs every block (with a warning): the report says so, and the cache
    identity equals that of no truncation."""
    model = lm(tokenizer, 3)
    assert effective_layers(model, 10) is None and effective_layers(model, 3) is None
    assert effective_layers(model, 2) == 2 and effective_layers(model, None) is None
    assert feature_used(model, "badge", 10) == ("badge", None) == feature_used(model, "badge", None)
    assert feature_used(model, "auto", None) == ("hidden_mean", 2)
    assert describe_feature(*feature_used(model, "badge", 3)) == "badge"


def test_feature_precision_bf16_runs_the_pass_under_autocast(tokenizer, lm_dataset, collator):
    """`feature_precision="bf16"` puts the feature pass under bf16 autocast on CPU (close to fp32, not equal); the
    report names it; `"auto"` on CPU is fp32 (bit-equal to `"fp32"`); the cache identity tells them apart; a bad
    value is refused naming the setting."""
    from hf_cluster_select.feature_cache import feature_identity

    model, n = lm(tokenizer, 3), 16
    lengths = [len(lm_dataset[i]["input_ids"]) for i in range(n)]
    rows, facts_of = {}, {}
    for precision in ("auto", "fp32", "bf16"):
        config = ClusterSelectConfig(strategy_kwargs={"feature_precision": precision})
        facts = facts_of[precision] = resolve_run_facts(model, config, shift_labels=True)
        rows[precision] = cached_or_computed_features(
            model, lm_dataset.select(range(n)), collator, config=config, facts=facts, lengths=lengths,
            batch_size=4, show_progress=False, cache=None, identity=None)[0]
    assert [facts_of[p].feature_autocast for p in ("auto", "fp32", "bf16")] == [None, False, True]
    assert facts_of["bf16"].feature_used == "hidden_mean after 2 blocks (bf16 forward)"
    assert facts_of["auto"].feature_used == "hidden_mean after 2 blocks"
    np.testing.assert_array_equal(rows["auto"], rows["fp32"])
    cosine = (rows["bf16"] * rows["fp32"]).sum(1)  # rows are L2-normalised
    assert 0.97 < cosine.min() and np.abs(rows["bf16"] - rows["fp32"]).max() > 1e-4  # bf16 ran, close to fp32
    identities = {p: feature_identity(model, ClusterSelectConfig(strategy_kwargs={"feature_precision": p}),
                                      facts_of[p], data_fingerprint="d") for p in ("auto", "fp32", "bf16")}
    assert identities["auto"] == identities["fp32"] != identities["bf16"]  # the precision that runs, not the setting
    assert identities["bf16"]["resolved_feature"] == ["hidden_mean", 2, True]
    with pytest.raises(ValueError, match="feature_precision"):
        ClusterSelectConfig(strategy_kwargs={"feature_precision": "fp16"})
    bf16_model = lm(tokenizer, 3).to(torch.bfloat16)  # a model loaded in bf16: its forward is bf16 whatever the setting
    assert resolve_run_facts(bf16_model, ClusterSelectConfig(strategy_kwargs={"feature_precision": "fp32"}),
                             shift_labels=True).feature_used == "hidden_mean after 2 blocks (bf16 forward)"


def test_fp32_features_stay_fp32_under_a_trainers_bf16_mixed_precision(tokenizer, lm_dataset, collator):
    """accelerate's bf16 mixed precision wraps `model.forward` in autocast (`Trainer(bf16=True)`): the feature pass
    bypasses that wrapper unless it runs in bf16 itself, so `"fp32"` / `"auto"` on CPU give the unprepared model's
    fp32 features and `"bf16"` its bf16 ones; the wrapper is back afterwards."""
    import copy

    from accelerate import Accelerator

    from accelerate.state import AcceleratorState

    plain, n = lm(tokenizer, 3), 16
    AcceleratorState._reset_state(reset_partial_state=True)  # a Trainer of an earlier test set another precision
    try:
        prepared = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(copy.deepcopy(plain))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert "_original_forward" in prepared.__dict__
    wrapper = prepared.forward
    lengths = [len(lm_dataset[i]["input_ids"]) for i in range(n)]

    def features(model, precision):
        config = ClusterSelectConfig(strategy_kwargs={"feature_precision": precision})
        return cached_or_computed_features(
            model, lm_dataset.select(range(n)), collator, config=config,
            facts=resolve_run_facts(model, config, shift_labels=True), lengths=lengths, batch_size=4,
            show_progress=False, cache=None, identity=None)[0]

    for precision in ("fp32", "auto", "bf16"):
        np.testing.assert_array_equal(features(prepared, precision), features(plain, precision))
    assert not np.allclose(features(prepared, "fp32"), features(prepared, "bf16"), atol=1e-4)
    assert prepared.forward == wrapper
