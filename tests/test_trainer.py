"""ClusterTrainer end to end on a tiny Llama: step plan, LR schedule, selected indices, weights, resume, errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, get_scheduler

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.data import INDEX_KEY


def make_args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        num_train_epochs=2,
        learning_rate=1e-3,
        warmup_steps=3,
        lr_scheduler_type="linear",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return TrainingArguments(**values)


class Recorder(TrainerCallback):
    """Records the learning rate after every optimizer step."""

    def __init__(self):
        self.lrs = []

    def on_step_end(self, args, state, control, **kwargs):
        self.lrs.append(kwargs["lr_scheduler"].get_last_lr()[0])


class RecordingTrainer(ClusterTrainer):
    """Records the example indices of every micro-batch that reaches `compute_loss` during training."""

    seen: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append((self.state.global_step, inputs[INDEX_KEY].tolist()))
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


def build(tmp_path, tiny_lm, lm_dataset, collator, config=None, cls=RecordingTrainer, **arg_overrides):
    trainer = cls(
        model=tiny_lm,
        args=make_args(tmp_path, **arg_overrides),
        train_dataset=lm_dataset,
        data_collator=collator,
        cluster_config=config or ClusterSelectConfig(data_fraction=0.5),
    )
    trainer.seen = []
    return trainer


def test_exact_steps_and_lr_schedule(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    recorder = Recorder()
    trainer.add_callback(recorder)
    result = trainer.train()
    plan = trainer.step_plan
    # 96 examples, keep 48; batch 4 on 1 rank: 12 batches/epoch, 2 epochs = 24 steps + 3 warm-up steps
    assert (plan.n_kept, plan.warmup_steps, plan.selected_steps_per_epoch, plan.total_steps) == (48, 3, 12, 27)
    assert plan.full_data_steps == 48
    assert result.global_step == 27 and trainer.state.global_step == 27 and trainer.state.max_steps == 27
    reference_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    reference = get_scheduler("linear", reference_optimizer, num_warmup_steps=3, num_training_steps=27)
    expected = []
    for _ in range(27):
        reference_optimizer.step()
        reference.step()
        expected.append(reference.get_last_lr()[0])
    assert recorder.lrs == pytest.approx(expected, abs=1e-12)
    assert recorder.lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_only_selected_indices_after_warmup(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    trainer.train()
    kept = set(trainer.selection.indices.tolist())
    assert len(kept) == 48
    warm = [i for step, batch in trainer.seen if step < 3 for i in batch]
    after = [i for step, batch in trainer.seen if step >= 3 for i in batch]
    assert len(warm) == len(set(warm)) >= 3  # 3 steps of distinct full-data examples (token-budget batch sizes vary)
    assert set(after) == kept
    assert len(after) == 96 and all(after.count(i) == 2 for i in kept)  # every kept example once per epoch


def test_gradient_accumulation_step_count(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, gradient_accumulation_steps=5, num_train_epochs=1,
                    warmup_steps=1)
    trainer.train()
    # 12 batches per epoch / 5 = 3 steps (last one with 2 micro-batches) + 1 warm-up step of 5 micro-batches
    assert trainer.state.global_step == 4
    assert len([b for s, b in trainer.seen if s < 1]) == 5
    assert len([b for s, b in trainer.seen if s >= 1]) == 12


def test_max_steps_is_exact(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, max_steps=17)
    trainer.train()
    assert trainer.state.global_step == 17
    assert trainer.step_plan.selected_steps == 14 and trainer.step_plan.selected_epochs == 2


def test_report_and_model_card(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    trainer.train()
    out = tmp_path / "out"
    report = json.loads((out / "selection_report.json").read_text())
    assert report["n_examples"] == 96 and report["n_kept"] == 48 and report["fraction_kept"] == 0.5
    assert sum(report["weights"]) == pytest.approx(96)
    assert len(report["raw_labels"]) == 96 and len(report["labels"]) == 96
    assert sorted(report["kept_indices"]) == trainer.selection.indices.tolist()
    for key in ("warmup_seconds", "features_seconds", "clustering_seconds", "training_seconds"):
        assert report[key] > 0
    assert report["full_data_steps"] == 48 and "estimated" in report["full_data_seconds_basis"]
    lengths = [len(row["input_ids"]) for row in lm_dataset]
    kept = [lengths[i] for i in report["kept_indices"]]
    assert report["input_tokens_total"] == sum(lengths) and report["input_tokens_kept"] == sum(kept)
    from hf_cluster_select.batching.padding import plan_padded_tokens, random_batch_padded_tokens

    sampler = trainer.selection_run.subset_sampler
    full_batch = random_batch_padded_tokens(np.asarray(lengths), 4, seed=trainer.cluster_config.selection_seed)
    ours_batch = plan_padded_tokens(sampler.lengths, sampler.plan(1))
    assert report["padded_tokens_per_batch_full"] == pytest.approx(full_batch)
    assert report["padded_tokens_per_batch_selected"] == pytest.approx(ours_batch)
    ratio = full_batch / ours_batch  # a step's cost follows its padded tokens
    assert ratio != pytest.approx(1.0, abs=1e-3)
    per_step = (report["warmup_seconds"] + report["training_seconds"] * ratio) / 27
    assert report["full_data_seconds"] == pytest.approx(per_step * 48)
    assert report["seconds_saved"] == pytest.approx(
        per_step * 48 - report["warmup_seconds"] - report["selection_seconds"] - report["training_seconds"])
    card = (out / "README.md").read_text()
    assert "hf_cluster_select" in card and "48" in card and "estimated" in card
    assert (out / "cluster_sizes.png").stat().st_size > 1000
    assert (out / "cluster_selection.npz").is_file()


def test_weighted_loss_equals_stock_with_unit_weights(tiny_lm, lm_dataset, collator, tmp_path):
    from hf_cluster_select.weighting import weighted_token_loss

    batch = collator([lm_dataset[i] for i in range(6)])
    out = tiny_lm(**batch)
    logits = out.logits
    ours = weighted_token_loss(logits, batch["labels"], torch.ones(6), shift=True)
    assert ours.item() == pytest.approx(out.loss.item(), rel=1e-6)
    n_items = int((batch["labels"][:, 1:] != -100).sum()) + 7
    stock = tiny_lm(**batch, num_items_in_batch=n_items).loss
    ours = weighted_token_loss(logits, batch["labels"], torch.ones(6), shift=True, num_items_in_batch=n_items)
    assert ours.item() == pytest.approx(stock.item(), rel=1e-6)
    # doubling one example's weight adds exactly that example's token-loss sum once more
    weights = torch.ones(6)
    weights[2] = 2.0
    single = weighted_token_loss(logits[2:3], batch["labels"][2:3], torch.ones(1), shift=True, num_items_in_batch=n_items)
    doubled = weighted_token_loss(logits, batch["labels"], weights, shift=True, num_items_in_batch=n_items)
    assert doubled.item() == pytest.approx(stock.item() + single.item(), rel=1e-5)
    # the gradient with respect to the logits is transformers' (labels shifted, logits not copied): the last
    # position gets none
    leaf = logits.detach().requires_grad_(True)
    from transformers.loss.loss_utils import ForCausalLMLoss

    ours_grad, = torch.autograd.grad(weighted_token_loss(leaf, batch["labels"], torch.ones(6), shift=True), leaf)
    stock_grad, = torch.autograd.grad(ForCausalLMLoss(leaf, batch["labels"], leaf.shape[-1]), leaf)
    torch.testing.assert_close(ours_grad, stock_grad, rtol=1e-5, atol=1e-8)
    assert ours_grad[:, -1].abs().max().item() == 0.0 and ours_grad.abs().max().item() > 0


def test_resume_gives_same_batches_and_weights(tmp_path, tiny_lm, lm_dataset, collator, _tiny_lm_base):
    import copy

    full = build(tmp_path / "a", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, save_strategy="steps",
                 save_steps=9)
    full.train()
    checkpoint = tmp_path / "a" / "out" / "checkpoint-9"
    assert (checkpoint / "cluster_selection.npz").is_file()
    resumed = build(tmp_path / "a", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, save_strategy="steps",
                    save_steps=9)
    resumed.run_selection = None  # selection must be loaded, never recomputed
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert np.array_equal(resumed.selection.indices, full.selection.indices)
    assert [b for s, b in resumed.seen] == [b for s, b in full.seen if s >= 9]
    for (name, p), (_, q) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    # the same checkpoint with a model of another shape: the changed config fields are named, nothing trains
    import tiny_assets
    from transformers import LlamaForCausalLM

    base = _tiny_lm_base.config
    wider = LlamaForCausalLM(tiny_assets.llama_config(base.vocab_size, intermediate_size=48, pad_token_id=base.pad_token_id,
                                                      bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id))
    other = build(tmp_path / "a", wider, lm_dataset, collator, save_strategy="steps", save_steps=9)
    with pytest.raises(ValueError, match=r"made for another model \(intermediate_size: 64 in the checkpoint, 48 now\)"):
        other.train(resume_from_checkpoint=str(checkpoint))
    assert other.state.global_step == 0


def test_easy_to_hard_runs_each_epoch_up_the_warmup_loss_and_resumes_exactly(tmp_path, lm_dataset, collator,
                                                                             _tiny_lm_base):
    """`order="easy_to_hard"`: 3 warm-up steps, then 2 epochs of 12 steps over 48 kept examples (one process: fixed
    batches). Every epoch runs from low to high feature-pass loss after the warm-up (each cluster's members in
    increasing loss); a run resumed from checkpoint-9, mid-way through the first subset epoch, replays the same
    batches; resuming it under `order="shuffled"` is allowed (batch order only) and trains other batches."""
    import copy

    config = ClusterSelectConfig(data_fraction=0.5, order="easy_to_hard")
    full = build(tmp_path / "a", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config=config,
                 save_strategy="steps", save_steps=9)
    full.train()
    run = full.selection_run
    assert run.plan.warmup_steps == 3 and run.plan.selected_steps_per_epoch == 12
    assert full.selection_report.batch_order == "easy_to_hard" and full.selection_report.batch_order_fallback is None
    loss = dict(zip(full.selection.indices.tolist(), run.difficulty.tolist()))
    cluster = dict(zip(full.selection.indices.tolist(), full.selection.labels.tolist()))
    assert len(set(loss.values())) > 40  # distinct warm-up losses (nats), not a constant
    for first in (3, 15):  # the two subset epochs
        batches = [b for s, b in full.seen if first <= s < first + 12]
        means = [np.mean([loss[i] for i in b]) for b in batches]
        assert np.mean(means[:6]) < np.mean(means[6:])  # the first half of the epoch is easier than the second
        assert np.corrcoef(np.arange(12), means)[0, 1] > 0.8  # (a shuffled run: 0.33 and 0.15)
        for c in set(cluster.values()):  # each cluster's members in increasing loss, batch after batch
            stream = [sorted(loss[i] for i in b if cluster[i] == c) for b in batches]
            stream = [x for x in stream if x]
            assert all(a[-1] <= b[0] for a, b in zip(stream, stream[1:]))
    full.create_model_card()
    assert "| Batch order | easy_to_hard |" in (tmp_path / "a" / "out" / "README.md").read_text()

    checkpoint = tmp_path / "a" / "out" / "checkpoint-9"
    resumed = build(tmp_path / "a", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config=config,
                    save_strategy="steps", save_steps=9)
    resumed.run_selection = None  # selection must be loaded, never recomputed
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert [b for s, b in resumed.seen] == [b for s, b in full.seen if s >= 9]
    np.testing.assert_array_equal(resumed.selection_run.difficulty, run.difficulty)
    for (name, p), (_, q) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    shuffled = build(tmp_path / "a", copy.deepcopy(_tiny_lm_base), lm_dataset, collator,
                     config=ClusterSelectConfig(data_fraction=0.5), save_strategy="no")
    shuffled.train(resume_from_checkpoint=str(checkpoint))
    assert np.array_equal(shuffled.selection.indices, full.selection.indices)
    assert shuffled.selection_report.batch_order == "shuffled"
    tail = [b for s, b in full.seen if s >= 9]
    assert len(shuffled.seen) == len(tail) and shuffled.seen != resumed.seen


def test_resume_during_warmup_then_selects(tmp_path, lm_dataset, collator, _tiny_lm_base):
    import copy

    full = build(tmp_path, copy.deepcopy(_tiny_lm_base), lm_dataset, collator, save_strategy="steps", save_steps=2)
    full.train()
    resumed = build(tmp_path, copy.deepcopy(_tiny_lm_base), lm_dataset, collator, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [b for s, b in resumed.seen] == [b for s, b in full.seen if s >= 2]
    assert np.array_equal(resumed.selection.indices, full.selection.indices)


def test_private_hooks_are_called(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    calls = []
    for name in ("set_initial_training_values", "_init_training_state", "_run_epoch", "get_train_dataloader",
                 "compute_loss"):
        original = getattr(ClusterTrainer, name)

        def spy(self, *a, _original=original, _name=name, **k):
            calls.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(ClusterTrainer, name, spy)
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, cls=ClusterTrainer, num_train_epochs=1)
    trainer.train()
    for name in ("set_initial_training_values", "_init_training_state", "_run_epoch", "get_train_dataloader",
                 "compute_loss"):
        assert name in calls, f"transformers no longer calls {name}"
    assert calls.count("_run_epoch") == 2  # warm-up epoch + one subset epoch


@pytest.mark.parametrize(
    "overrides, config, message",
    [
        ({"warmup_steps": 60}, None, "warmup_steps"),
        ({"per_device_train_batch_size": 64}, None, "one global batch"),
        ({"per_device_train_batch_size": 40}, ClusterSelectConfig(data_fraction=0.3), "raise `data_fraction`"),
        ({"max_steps": 3}, None, "warmup_steps"),
    ],
)
def test_bad_plans_fail_before_training(tmp_path, tiny_lm, lm_dataset, collator, overrides, config, message):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, config=config, **overrides)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=message):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert not os.path.exists(tmp_path / "out" / "selection_report.json")


def test_dataset_without_len_is_rejected(tmp_path, tiny_lm, lm_dataset, collator):
    stream = lm_dataset.to_iterable_dataset()
    with pytest.raises(ValueError, match="__len__"):  # at construction (reliability: test_validation.py)
        ClusterTrainer(model=tiny_lm, args=make_args(tmp_path, max_steps=5), train_dataset=stream,
                       data_collator=collator)


def test_bad_config_type(tmp_path, tiny_lm, lm_dataset, collator):
    with pytest.raises(TypeError, match="cluster_config"):
        ClusterTrainer(model=tiny_lm, args=make_args(tmp_path), train_dataset=lm_dataset, cluster_config={"a": 1})


class FixedOrderSampler(torch.utils.data.Sampler):
    """Yields a given list of dataset indices, once (the order a ClusterTrainer run trained on)."""

    def __init__(self, order):
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


class OrderedStockTrainer(Trainer):
    """Stock `Trainer` fed one fixed index order, recording every training loss."""

    order: list

    def _get_train_sampler(self, train_dataset=None):
        return FixedOrderSampler(self.order)


def test_stock_trainer_equivalence_at_full_fraction(tmp_path, lm_dataset, collator, _tiny_lm_base, monkeypatch):
    """data_fraction=1.0 (a warm-up asked for): no warm-up, no feature pass and no clustering run (nothing to
    select), the stock step count, and the same batches fed to a stock Trainer with the same recipe give the same
    loss at every step and the same final weights (the plan, LR schedule, loader and loss path add nothing)."""
    import copy

    from hf_cluster_select import pipeline
    from hf_cluster_select.features import FEATURES

    def refuse(*args, **kwargs):
        raise AssertionError("no model work at data_fraction=1.0")

    monkeypatch.setitem(FEATURES._entries, "hidden_mean", refuse)  # feature="auto" on a language model
    monkeypatch.setattr(pipeline, "cluster_features", refuse)
    config = ClusterSelectConfig(data_fraction=1.0, selection_warmup_steps=4, strategy_kwargs={"balance_tokens": False})
    ours = build(tmp_path / "o", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config=config)
    ours.train()
    plan = ours.step_plan
    assert plan.warmup_steps == 0 and plan.total_steps == 2 * 24 and ours.state.global_step == plan.total_steps
    assert np.all(ours.selection.weights == 1.0) and ours.selection.n_kept == 96
    report = ours.selection_report
    assert report.n_clusters == 1 and report.clustering_method == "none" and report.token_kind == "input"
    assert report.tokens_total == report.tokens_kept == int(sum(len(r["input_ids"]) for r in lm_dataset))
    assert report.features_seconds < 0.05
    batches = [ids for _, ids in ours.seen]
    assert all(len(ids) == 4 for ids in batches)  # fixed-size batches, so a stock DataLoader rebuilds them exactly
    assert sorted(i for ids in batches[:24] for i in ids) == list(range(96))  # epoch 1 = every example once

    stock = OrderedStockTrainer(model=copy.deepcopy(_tiny_lm_base), args=make_args(
        tmp_path / "s", max_steps=plan.total_steps), train_dataset=lm_dataset, data_collator=collator)
    stock.order = [i for ids in batches for i in ids]
    stock.train()
    ours_losses = [h["loss"] for h in ours.state.log_history if "loss" in h and "train_loss" not in h]
    stock_losses = [h["loss"] for h in stock.state.log_history if "loss" in h and "train_loss" not in h]
    assert len(ours_losses) == len(stock_losses) == plan.total_steps
    assert ours_losses == pytest.approx(stock_losses, abs=1e-6)
    for (name, p), (_, q) in zip(ours.model.named_parameters(), stock.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_second_train_call_reselects(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    """A second `train()` starts a new SelectionRun: it plans again, warms up and re-selects with the model as it is."""
    from hf_cluster_select.features import FEATURES

    calls = []
    name = "hidden_mean"  # feature="auto" on a language model
    original = FEATURES.get(name)
    monkeypatch.setitem(FEATURES._entries, name, lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    trainer.train()
    first_run, first_steps = trainer.selection_run, trainer.state.global_step
    trainer.seen = []
    trainer.train()
    assert len(calls) == 2 and trainer.selection_run is not first_run
    assert trainer.state.global_step == first_steps == trainer.step_plan.total_steps
    assert len(trainer.seen) == first_steps  # batch 4, no accumulation: one micro-batch per step
    assert {i for s, ids in trainer.seen if s >= 3 for i in ids} <= set(trainer.selection.indices.tolist())


def test_subclassed_causal_lm_keeps_the_label_shift(tmp_path, tokenizer, lm_dataset, collator):
    """A model class whose name transformers does not know (`class MyLM(LlamaForCausalLM)`) still gets the causal
    shift in the weighted loss after selection (the defect: it was decided from the class name)."""
    import tiny_assets
    from transformers import LlamaForCausalLM

    from hf_cluster_select.integrations.trainer import labels_are_shifted
    from hf_cluster_select.weighting import weighted_token_loss

    class MyLM(LlamaForCausalLM):
        pass

    torch.manual_seed(0)
    model = MyLM(tiny_assets.llama_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id))
    assert labels_are_shifted(model)
    trainer = build(tmp_path, model, lm_dataset, collator)
    trainer.train()
    kept = torch.as_tensor(trainer.selection.indices[:4])
    weights = trainer.selection_run.loss_weights(kept)
    assert weights is not None and not torch.all(weights == 1)
    batch = collator([lm_dataset[int(i)] for i in kept])
    trainer.model.eval()
    ours = trainer.compute_loss(trainer.model, {**batch, INDEX_KEY: kept})
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shifted = weighted_token_loss(logits, batch["labels"], weights, shift=True)
    unshifted = weighted_token_loss(logits, batch["labels"], weights, shift=False)
    assert ours.item() == pytest.approx(shifted.item(), rel=1e-5)
    assert abs(ours.item() - unshifted.item()) > 1e-3


def test_classification_labels_are_not_shifted(tokenizer):
    import tiny_assets
    from transformers import LlamaForSequenceClassification

    from hf_cluster_select.integrations.trainer import labels_are_shifted

    model = LlamaForSequenceClassification(tiny_assets.llama_config(len(tokenizer), num_labels=2,
                                                                    pad_token_id=tokenizer.pad_token_id))
    assert not labels_are_shifted(model)


@pytest.mark.parametrize("config", [ClusterSelectConfig(), ClusterSelectConfig.paper(data_fraction=1.0)],
                         ids=["subset", "paper_weights_at_full_data"])
@pytest.mark.parametrize("overrides, extra, message", [
    ({"label_smoothing_factor": 0.1}, {}, "label_smoothing_factor=0.1"),
    ({}, {"compute_loss_func": lambda outputs, labels, num_items_in_batch=None: outputs.loss}, "compute_loss_func"),
])
def test_settings_that_would_drop_the_weights_are_refused(tmp_path, tiny_lm, lm_dataset, collator, overrides, extra,
                                                          message, config):
    """Also at `data_fraction=1.0` with CluSTER's allocation, whose per-rank weights K·|C_k|/N are not 1 (they were
    dropped silently there: the check ran only below 1.0)."""
    trainer = ClusterTrainer(model=tiny_lm, args=make_args(tmp_path, **overrides), train_dataset=lm_dataset,
                             data_collator=collator, cluster_config=config, **extra)
    with pytest.raises(ValueError, match=message):
        trainer.plan()  # before any model work, whatever the world size
    assert trainer.state.global_step == 0


def test_label_smoothing_is_fine_when_no_weight_can_differ_from_one(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = ClusterTrainer(model=tiny_lm, args=make_args(tmp_path, label_smoothing_factor=0.1),
                             train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=1.0))
    plan = trainer.plan()
    assert trainer.selection_run.facts.loss_weighted is False and plan.n_kept == len(lm_dataset)


def test_regression_head_is_refused_before_training(tmp_path, tokenizer):
    import tiny_assets
    from datasets import Dataset
    from transformers import LlamaForSequenceClassification

    model = LlamaForSequenceClassification(tiny_assets.llama_config(len(tokenizer), num_labels=1,
                                                                    pad_token_id=tokenizer.pad_token_id))
    data = Dataset.from_dict({"input_ids": [[4, 5, 6]] * 16, "labels": [0.5, 1.5] * 8})
    trainer = ClusterTrainer(model=model, args=make_args(tmp_path), train_dataset=data)
    with pytest.raises(ValueError, match="regression or multi-label head"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_stratify_column_sets_the_shares(tmp_path, tiny_lm, lm_dataset, collator):
    """A `task` column the model never sees: each task keeps its proportional share of the budget."""
    data = lm_dataset.add_column("task", ["rare" if i < 12 else "common" for i in range(len(lm_dataset))])
    config = ClusterSelectConfig(data_fraction=0.5, stratify_column="task")
    trainer = build(tmp_path, tiny_lm, data, collator, config=config)
    trainer.train()
    kept = trainer.selection.indices
    assert (kept < 12).sum() == 6 and len(kept) == 48
    missing = build(tmp_path / "m", tiny_lm, lm_dataset, collator,
                    config=ClusterSelectConfig(stratify_column="task"))
    with pytest.raises(ValueError, match="`stratify_column` 'task' is not a column"):
        missing.train()
    assert missing.state.global_step == 0


def test_a_sampler_override_is_reported(tmp_path, tiny_lm, lm_dataset, collator):
    """A subclass overriding `_get_train_sampler` is told the override is not used (it never would be)."""

    class MySampling(ClusterTrainer):
        def _get_train_sampler(self, train_dataset=None):
            raise AssertionError("never called")

    with pytest.warns(UserWarning, match="MySampling._get_train_sampler is not called"):
        trainer = MySampling(model=tiny_lm, args=make_args(tmp_path),
                             train_dataset=lm_dataset, data_collator=collator)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ClusterTrainer(model=trainer.model, args=trainer.args, train_dataset=lm_dataset, data_collator=collator)


def test_loss_and_dataloader_overrides_that_drop_the_selection_are_reported(tmp_path, tiny_lm, lm_dataset, collator):
    """A `compute_loss` that never reaches the parent's trains unweighted, and a `get_train_dataloader` override is
    used for the warm-up only: each is reported once, with the supported way; an override that calls `super()` is
    not reported."""
    import warnings

    class OwnLoss(ClusterTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    class OwnLoader(ClusterTrainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    class ScaledLoss(ClusterTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return 2 * super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    kwargs = dict(model=tiny_lm, args=make_args(tmp_path), train_dataset=lm_dataset, data_collator=collator)
    with pytest.warns(UserWarning, match=r"OwnLoss.compute_loss does not call the parent's compute_loss.*"
                                         r"super\(\).compute_loss"):
        OwnLoss(**kwargs)
    with pytest.warns(UserWarning, match="OwnLoader.get_train_dataloader is used for the warm-up only"):
        OwnLoader(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ScaledLoss(**kwargs)
        OwnLoss(**kwargs)  # once per class


def test_one_process_trains_fixed_batches_unless_token_balance_is_asked(tmp_path, tiny_lm, lm_dataset, collator):
    """`balance_tokens="auto"` (the default) is off on one process: every per-device batch of the kept set holds
    exactly `per_device_train_batch_size` examples (48 kept / 4); `balance_tokens=True` packs by tokens instead."""
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    trainer.train()
    sampler = trainer.selection_run.subset_sampler
    assert sampler.balance_tokens is False
    assert [len(batch) for batch in sampler.plan(1)] == [4] * 12
    config = ClusterSelectConfig(data_fraction=0.5, strategy_kwargs={"balance_tokens": True})
    packed = build(tmp_path / "packed", tiny_lm, lm_dataset, collator, config=config)
    packed.train()
    sizes = [len(batch) for batch in packed.selection_run.subset_sampler.plan(1)]
    assert packed.selection_run.subset_sampler.balance_tokens is True and sum(sizes) == 48 and len(set(sizes)) > 1


class AdamSteps(TrainerCallback):
    """Records Adam's step count of the first trainable parameter after every optimizer step."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, optimizer=None, model=None, **kwargs):
        parameter = next(p for p in model.parameters() if p.requires_grad)
        self.steps.append(int(getattr(optimizer, "optimizer", optimizer).state[parameter]["step"]))


def test_reset_optimizer_state_restarts_adam_at_the_subset_and_resumes_exactly(tmp_path, lm_dataset, collator,
                                                                               _tiny_lm_base):
    """`reset_optimizer_state=True`: 3 warm-up steps, then Adam starts again (step count 1) on the subset while
    the weights and LR carry on; a run resumed at the transition (checkpoint-3, saved with the warm-up's state) or
    mid-subset (checkpoint-9) ends with the uninterrupted run's weights. Off (the default), Adam counts on."""
    import copy

    config = ClusterSelectConfig(data_fraction=0.5, strategy_kwargs={"reset_optimizer_state": True})
    runs = {}
    for name, cfg in (("reset", config), ("kept", ClusterSelectConfig(data_fraction=0.5))):
        trainer = build(tmp_path / name, copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config=cfg,
                        save_strategy="steps", save_steps=3)
        steps = AdamSteps()
        trainer.add_callback(steps)
        trainer.train()
        runs[name] = (trainer, steps.steps)
    assert runs["reset"][1] == [1, 2, 3] + list(range(1, 25))
    assert runs["kept"][1] == list(range(1, 28))
    full, kept = runs["reset"][0], runs["kept"][0]
    assert np.array_equal(full.selection.indices, kept.selection.indices)  # the selection is not affected
    assert [b for s, b in full.seen] == [b for s, b in kept.seen]
    assert any(not torch.allclose(p, q) for p, q in zip(full.model.parameters(), kept.model.parameters()))
    for step in (3, 9):
        resumed = build(tmp_path / "reset", copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config=config,
                        save_strategy="no")
        resumed.train(resume_from_checkpoint=str(tmp_path / "reset" / "out" / f"checkpoint-{step}"))
        for (name, p), (_, q) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
            assert torch.allclose(p, q, atol=1e-6), (step, name)
