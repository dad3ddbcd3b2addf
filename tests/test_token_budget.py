"""`budget_unit="tokens"`: a budget counted in tokens, from the selection to the step plan and a real training run."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_assets
import torch
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer, Selection, SelectionRun
from hf_cluster_select.batching.plan import plan_epoch
from hf_cluster_select.batching.sampler import ClusterBatchSampler
from hf_cluster_select.data import INDEX_KEY
from hf_cluster_select.reporting.model_card import selection_card_section
from hf_cluster_select.selection import select_from_labels


def two_clusters():
    """Cluster 0: 50 short examples (10 tokens) spread around the origin; cluster 1: 50 examples, 25 long ones
    (190 tokens) at its centroid and 25 short ones (10 tokens) far from it. 5,500 tokens in all."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 50)
    lengths = np.r_[np.full(50, 10), np.tile([190, 10], 25)]
    points = np.r_[rng.normal(size=(50, 2)), np.zeros((50, 2))]
    points[50:][lengths[50:] == 190] += 100 + rng.normal(scale=0.01, size=(25, 2))
    points[50:][lengths[50:] == 10] += 100 + 5 * np.sign(rng.normal(size=(25, 2)))
    return labels, lengths, points


def test_token_budget_splits_tokens_over_clusters_and_recounts_for_the_rule():
    labels, lengths, points = two_clusters()
    by_examples = select_from_labels(labels, points, data_fraction=0.3, within_cluster="central")
    assert by_examples.n_kept == 30 and np.bincount(by_examples.labels).tolist() == [15, 15]
    chosen = select_from_labels(labels, points, data_fraction=0.3, within_cluster="central", lengths=lengths,
                                budget_unit="tokens")
    kept = lengths[chosen.indices]
    # budget 1,650 tokens: 150 for cluster 0 (500 tokens) = 15 examples; 1,500 for cluster 1 (5,000). Its mean
    # length (100) asks for 15 members, but the central ones are the 190-token ones: recounted to round(1500/190) = 8
    assert np.bincount(chosen.labels).tolist() == [15, 8]
    assert kept[chosen.labels == 0].sum() == 150 and kept[chosen.labels == 1].tolist() == [190] * 8
    assert kept.sum() == 1670  # within one example of the 1,650-token budget
    assert chosen.weights[chosen.labels == 0] == pytest.approx(np.full(15, 50 / 15))  # each cluster stands for its size
    assert chosen.weights[chosen.labels == 1] == pytest.approx(np.full(8, 50 / 8))


def test_token_budget_with_uniform_quota_gives_each_cluster_the_same_tokens():
    labels, lengths, points = two_clusters()
    chosen = select_from_labels(labels, points, data_fraction=0.3, within_cluster="random", quota="uniform",
                                lengths=lengths, budget_unit="tokens", seed=3)
    kept = lengths[chosen.indices]
    tokens = [int(kept[chosen.labels == c].sum()) for c in (0, 1)]
    assert tokens[0] == 500  # cluster 0 holds only 500 tokens: all 50 kept, the rest of the budget goes to cluster 1
    assert abs(tokens[1] - 1150) <= 190 and abs(sum(tokens) - 1650) <= 190  # within one long example


def test_token_budget_duplicates_and_deferred_examples():
    labels = np.zeros(40, dtype=np.int64)
    lengths = np.full(40, 5)
    points = np.arange(40, dtype=np.float64)[:, None]
    groups = np.r_[np.zeros(20), np.arange(1, 21)].astype(np.int64)  # rows 0-19 are one row repeated 20 times
    chosen = select_from_labels(labels, points, data_fraction=0.25, within_cluster="random", lengths=lengths,
                                budget_unit="tokens", groups=groups)
    assert lengths[chosen.indices].sum() == 50 and (chosen.indices < 20).sum() <= 1  # the repeated row: one slot
    deferred = np.r_[np.zeros(10, bool), np.ones(30, bool)]  # 10 eligible rows hold 50 tokens; budget 60
    chosen = select_from_labels(labels, points, data_fraction=0.3, within_cluster="random", lengths=lengths,
                                budget_unit="tokens", deferred=deferred)
    assert chosen.indices.tolist() == list(range(12)) and chosen.weights == pytest.approx(np.full(12, 40 / 12))


def test_token_budget_bad_input():
    labels, lengths, points = two_clusters()
    with pytest.raises(ValueError, match="`lengths`"):
        select_from_labels(labels, points, data_fraction=0.3, budget_unit="tokens")
    with pytest.raises(ValueError, match="`lengths` must be 100 ints >= 1"):
        select_from_labels(labels, points, data_fraction=0.3, budget_unit="tokens", lengths=lengths[:5])
    with pytest.raises(ValueError, match="`budget_unit` must be one of"):
        select_from_labels(labels, points, data_fraction=0.3, budget_unit="bytes")
    with pytest.raises(ValueError, match="`budget_unit` must be one of"):
        ClusterSelectConfig(budget_unit="words")
    with pytest.raises(ValueError, match="needs `balance_tokens`=True or 'auto', `allocation`='balanced'.*got balance_tokens=False"):
        ClusterSelectConfig(budget_unit="tokens", strategy_kwargs={"balance_tokens": False})
    with pytest.raises(ValueError, match="allocation='paper'"):
        ClusterSelectConfig.paper(budget_unit="tokens", strategy_kwargs={"balance_tokens": True})
    with pytest.raises(ValueError, match="quota='uniform'"):
        ClusterSelectConfig(budget_unit="tokens", strategy_kwargs={"quota": "uniform"})


def test_token_budget_lands_within_one_member_for_a_nested_rule():
    # one cluster: 15 central members of 2 tokens, 5 outlying ones of 100; budget 0.3 · 530 = 159 tokens. Central
    # keeps 15 (30 tokens), 16 (130) or 17 (230): 16 is the closest, within one member
    points = np.r_[np.zeros((15, 1)), np.full((5, 1), 10.0)] + np.arange(20)[:, None] * 1e-3
    lengths = np.r_[np.full(15, 2), np.full(5, 100)]
    chosen = select_from_labels(np.zeros(20, int), points, data_fraction=0.3, within_cluster="central",
                                lengths=lengths, budget_unit="tokens")
    assert chosen.n_kept == 16 and lengths[chosen.indices].sum() == 130
    for rule in ("facility_location", "peripheral", "kcenter"):
        chosen = select_from_labels(np.zeros(20, int), points, data_fraction=0.3, within_cluster=rule,
                                    lengths=lengths, budget_unit="tokens")
        assert abs(lengths[chosen.indices].sum() - 159) <= 100, rule


@pytest.mark.parametrize("m", [9, 40, 64, 150, 250])
def test_plan_epoch_with_a_fixed_step_count_places_every_example_once(m):
    rng = np.random.default_rng(m)
    labels, lengths = rng.integers(0, 3, m), rng.integers(5, 100, m)
    plan = plan_epoch(labels, lengths, world_size=2, per_device_batch_size=8, seed=0, epoch=0, micro_steps=4)
    assert len(plan) == 8 and all(plan)
    flat = sorted(i for batch in plan for i in batch)
    assert flat == (list(range(m)) if m >= 8 else flat)
    assert max(len(b) for b in plan) <= 4 * 8


def test_plan_epoch_refuses_a_step_count_that_cannot_hold_the_examples():
    with pytest.raises(ValueError, match="`micro_steps`=2 cannot hold 200 examples"):
        plan_epoch(np.zeros(200, int), np.full(200, 4), world_size=2, per_device_batch_size=4, seed=0, epoch=0,
                   micro_steps=2)
    with pytest.raises(ValueError, match="needs balance_tokens"):
        plan_epoch(np.zeros(40, int), np.full(40, 4), world_size=2, per_device_batch_size=4, seed=0, epoch=0,
                   micro_steps=2, balance_tokens=False)
    with pytest.raises(ValueError, match="only for a step count fixed in advance"):
        ClusterBatchSampler(np.arange(8), np.r_[np.zeros(4, int), np.ones(4, int)], np.full(8, 3), world_size=2,
                            per_device_batch_size=2, allocation="paper", batches_per_rank=3)


def test_selection_run_keeps_the_planned_steps_for_any_kept_count():
    lengths = [4] * 20 + [36] * 20  # 800 tokens
    config = ClusterSelectConfig(data_fraction=0.5, budget_unit="tokens", selection_warmup_steps=0)
    run = SelectionRun(config, tiny_assets.run_facts(), lengths=lengths, world_size=2, per_device_batch_size=2, gradient_accumulation_steps=1,
                       num_train_epochs=1)
    assert (run.plan.n_kept, run.plan.selected_steps_per_epoch) == (20, 5)  # steps of the same share of examples
    kept = np.r_[np.arange(20), np.arange(20, 29)]  # 29 examples, 80 + 324 = 404 tokens
    labels = np.r_[np.zeros(20), np.ones(20)].astype(np.int64)
    run.adopt(Selection(indices=kept, weights=np.r_[np.ones(20), np.full(9, 20 / 9)], labels=labels[kept],
                        n_total=40), labels, labels)
    sampler = run.sampler_for(0)
    assert len(sampler) == 10 and sorted(i for batch in sampler for i in batch) == kept.tolist()
    assert run.plan.selected_steps == 5
    few_steps = SelectionRun(ClusterSelectConfig(data_fraction=0.1, budget_unit="tokens", selection_warmup_steps=0),
                             tiny_assets.run_facts(), lengths=lengths, world_size=2, per_device_batch_size=1, gradient_accumulation_steps=1,
                             num_train_epochs=1)
    assert few_steps.plan.selected_batches_per_epoch == 2  # 4 planned examples: room for 2 · 2 · 4 · 1 = 16
    with pytest.raises(ValueError, match="kept 20 examples, more than the 16 that the planned 2 steps"):
        few_steps.adopt(Selection(indices=np.arange(20), weights=np.ones(20), labels=labels[:20], n_total=40),
                        labels, labels)


def test_cluster_trainer_trains_the_planned_steps_on_a_token_share(tmp_path, tiny_lm, lm_dataset, collator):
    seen = []

    class Recording(ClusterTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training and self.state.global_step >= 2:
                seen.extend(inputs[INDEX_KEY].tolist())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1,
                             learning_rate=1e-3, warmup_steps=2, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, seed=0, disable_tqdm=True)
    config = ClusterSelectConfig(data_fraction=0.3, budget_unit="tokens")
    trainer = Recording(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                        cluster_config=config)
    result = trainer.train()
    plan = trainer.step_plan
    lengths = np.array([len(x) for x in lm_dataset["input_ids"]])
    report = trainer.selection_report
    kept = np.asarray(trainer.selection.indices)
    assert plan.selected_steps == -(-29 // 4) and result.global_step == plan.total_steps == 2 + plan.selected_steps
    assert sorted(seen) == sorted(kept.tolist())  # every kept example exactly once in the one epoch
    assert report.input_tokens_total == lengths.sum() and report.input_tokens_kept == lengths[kept].sum()
    assert abs(lengths[kept].sum() - 0.3 * lengths.sum()) <= lengths.max() * report.n_clusters / 2
    card = selection_card_section(report)
    share = lengths[kept].sum() / lengths.sum()
    assert (f"| Input tokens kept (the budget) | {lengths[kept].sum():,} / {lengths.sum():,} ({100 * share:.1f}%) |"
            in card)
    assert torch.isfinite(torch.tensor(result.training_loss))
