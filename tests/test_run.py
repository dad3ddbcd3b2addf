"""`SelectionRun` without a Trainer: plan, warm-up, weights, samplers, re-planning and resume identity (ms)."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_assets
import torch

from hf_cluster_select import ClusterSelectConfig, Selection, SelectionRun
from hf_cluster_select.persistence import SavedSelection

LENGTHS = [3 + (i % 5) for i in range(40)]


FACT_NAMES = ("shift_labels", "strata", "token_digest", "model_config")


def make_run(config=None, **overrides):
    """A `SelectionRun` of 40 examples on 2 ranks; `overrides` of its arguments or of its `RunFacts`."""
    facts = tiny_assets.run_facts(**{k: overrides.pop(k) for k in FACT_NAMES if k in overrides})
    values = dict(lengths=LENGTHS, world_size=2, per_device_batch_size=2, gradient_accumulation_steps=1,
                  num_train_epochs=2, max_steps=-1, lr_warmup_steps=3)
    values.update(overrides)
    return SelectionRun(config or ClusterSelectConfig(data_fraction=0.5), facts, **values)


def selection_of(indices, all_labels):
    """The selection of `indices` with weights |C_c| / kept_c (cluster sizes from `all_labels` `[n]`)."""
    indices, all_labels = np.asarray(indices, dtype=np.int64), np.asarray(all_labels, dtype=np.int64)
    labels = all_labels[indices]
    weights = np.array([(all_labels == c).sum() / (labels == c).sum() for c in labels], dtype=np.float64)
    return Selection(indices=indices, weights=weights, labels=labels, n_total=all_labels.size)


def test_plan_from_plain_values():
    run = make_run()
    plan = run.plan
    assert (plan.n_examples, plan.n_kept, plan.warmup_steps) == (40, 20, 3)
    assert plan.selected_batches_per_epoch == 5 and plan.selected_steps == 10 and plan.total_steps == 13
    assert len(run.warmup_sampler) == 3 * 2  # warm-up steps × accumulation × world size
    assert run.facts.shift_labels and run.selection is None and run.loss_weights(torch.arange(4)) is None


def test_warmup_ratio_and_config_override():
    assert make_run(lr_warmup_steps=0.2).plan.warmup_steps == 3  # smallest w with w = ceil(0.2 · (w + 10))
    assert make_run(ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0), lr_warmup_steps=5).plan.warmup_steps == 0
    assert make_run(max_steps=20, lr_warmup_steps=0.1).plan.total_steps == 20


def test_adopt_builds_weights_and_subset_sampler():
    run = make_run()
    kept = np.r_[np.arange(16), np.arange(30, 34)]  # 16 of cluster 0 (30 examples), 4 of cluster 1 (10)
    labels = np.r_[np.zeros(30), np.ones(10)].astype(np.int64)
    chosen = selection_of(kept, labels)
    run.adopt(chosen, labels, labels)
    dense = run.dense_loss_weights
    assert dense.shape == (40,) and float(dense[20]) == 0.0
    assert float(dense[kept].mean()) == pytest.approx(1.0)  # mean 1 over the kept set
    assert run.loss_weights(torch.tensor([0, 30])).tolist() == pytest.approx([30 / 16 * 20 / 40, 10 / 4 * 20 / 40])
    even = make_run()
    even.adopt(selection_of(np.arange(0, 40, 2), labels), labels, labels)  # 15 of 30 and 5 of 10: weights 1
    assert even.loss_weights(torch.tensor([0, 30])) is None  # every weight of the batch is 1: the stock loss
    sampler = run.sampler_for(1)
    assert sampler.epoch == 1 and len(sampler) == 10
    assert sorted(i for batch in sampler for i in batch) == kept.tolist()
    assert run.sampler_for(0) is run.warmup_sampler


def test_adopt_refuses_another_budget_and_other_data():
    run = make_run()
    with pytest.raises(ValueError, match="kept 10 of 40 examples, but this run keeps 20 of 40"):
        run.adopt(selection_of(np.arange(10), np.zeros(40)), np.zeros(40), np.zeros(40))
    saved = SavedSelection(selection_of(np.arange(20), np.zeros(40)), np.zeros(40, dtype=np.int64),
                           np.zeros(40, dtype=np.int64), {}, "not-this-data", {})
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        run.adopt_saved(saved)
    with pytest.raises(RuntimeError, match="no selection yet"):
        run.sampler_for(1)


def test_paper_allocation_replans_until_frozen():
    config = ClusterSelectConfig.paper(data_fraction=0.5)
    run = make_run(config)
    assert run.selects_before_training and run.plan.warmup_steps == 0
    labels = np.r_[np.zeros(28), np.ones(12)].astype(np.int64)
    kept = np.r_[np.arange(14), np.arange(28, 34)]  # 14 of cluster 0, 6 of cluster 1
    run.adopt(selection_of(kept, labels), labels, labels)
    assert run.plan.selected_batches_per_epoch == 7  # ceil(largest kept cluster 14 / B 2)
    assert run.dense_loss_weights[0].item() == pytest.approx(2 * 28 / 40)  # K·|C_k|/N
    frozen = make_run(config)
    frozen.freeze_plan()
    with pytest.raises(ValueError, match="frozen step plan"):
        frozen.adopt(selection_of(kept, labels), labels, labels)


def test_paper_allocation_needs_two_ranks():
    with pytest.raises(ValueError, match="at least 2 processes"):
        make_run(ClusterSelectConfig.paper(), world_size=1)


def test_strata_must_cover_every_example():
    assert make_run(strata=["a"] * 40).facts.strata == ("a",) * 40
    with pytest.raises(ValueError, match="one value per example"):
        make_run(strata=["a"] * 39)


def test_warns_when_max_steps_ends_before_one_pass_over_the_subset():
    """20 kept examples, 4 per step: 5 steps per pass. max_steps = 3 warm-up + 2 leaves 8 of them trained on."""
    with pytest.warns(UserWarning, match=r"about 8 of them will be trained on.*data_fraction \(to about 0\.2\)"):
        make_run(max_steps=5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_run(max_steps=8)  # 5 selected steps: one whole pass, no warning


def test_resume_refuses_other_tokens_and_other_selection_settings():
    """A saved selection is reused only for the same tokens (not just the same lengths) and the same
    selection-relevant settings; batching-only settings may change."""
    from hf_cluster_select.data import token_digest
    from hf_cluster_select.persistence import data_fingerprint

    rows = [{"input_ids": list(range(n))} for n in LENGTHS]
    other = [{"input_ids": [7] * n} for n in LENGTHS]  # the same lengths, other tokens
    digest = token_digest(rows)
    assert digest == token_digest([dict(r) for r in rows]) and digest != token_digest(other)
    masked = [dict(r, labels=list(r["input_ids"])) for r in rows]
    remasked = [dict(r) for r in masked]
    remasked[5] = dict(remasked[5], labels=[-100] + remasked[5]["labels"][1:])  # one label mask changed
    assert token_digest(masked) != token_digest(remasked) and token_digest(masked) != digest
    with_mask = [dict(r, attention_mask=[1] * len(r["input_ids"])) for r in rows]
    half_masked = [dict(r, attention_mask=[1] * (len(r["input_ids"]) - 1) + [0]) for r in rows]
    assert len({token_digest(rows), token_digest(with_mask), token_digest(half_masked)}) == 3  # every input column
    import datasets

    assert token_digest(datasets.Dataset.from_list(half_masked)) == token_digest(half_masked)  # same for datasets
    config = ClusterSelectConfig(data_fraction=0.5)
    run = make_run(config, token_digest=digest)
    selection = selection_of(np.arange(20), np.zeros(40))
    zeros = np.zeros(40, dtype=np.int64)

    def saved(config_dict, fingerprint=None):
        return SavedSelection(selection, zeros, zeros, config_dict, fingerprint or run.fingerprint, {})

    with pytest.raises(ValueError, match="fingerprint mismatch"):
        run.adopt_saved(saved(config.to_dict(), data_fingerprint(np.asarray(LENGTHS), token_digest(other))))
    changed = dict(config.to_dict(), selection_seed=7, within_cluster="random")
    with pytest.raises(ValueError, match=r"selection_seed: 7 in the checkpoint, 42 now; within_cluster: 'random' in the checkpoint, 'facility_location' now"):
        run.adopt_saved(saved(changed))
    with pytest.raises(ValueError, match=r"data_fraction: 0\.25 in the checkpoint, 0\.5 now"):
        run.adopt_saved(saved(dict(config.to_dict(), data_fraction=0.25)))
    with pytest.raises(ValueError, match=r"kept_per_cluster: 8 in the checkpoint, 4 now"):  # a strategy setting
        run.adopt_saved(saved(dict(config.to_dict(), strategy_kwargs={"kept_per_cluster": 8})))
    run.adopt_saved(saved(dict(config.to_dict(), strategy_kwargs={"balance_window": 3, "balance_tokens": False})))  # batching only
    assert run.selection is selection
    model = {"model_class": "LlamaForCausalLM", "hidden_size": 32, "num_hidden_layers": 2}
    with_model = make_run(config, token_digest=digest, model_config=model)
    other_model = SavedSelection(selection, zeros, zeros, config.to_dict(), run.fingerprint,
                                 {"model_config": dict(model, hidden_size=64, rope_theta=1e4)})
    with pytest.raises(ValueError, match=r"another model \(hidden_size: 64 in the checkpoint, 32 now; rope_theta: "
                                         r"10000\.0 in the checkpoint, '\(unset\)' now\)"):
        with_model.adopt_saved(other_model)
    with_model.adopt_saved(other_model, check_model=False)  # ClusterTrainer(selection=...): any model may train on it
    assert with_model.selection is selection
    with pytest.raises(ValueError, match="fingerprint mismatch"):  # a lengths-only fingerprint (0.1) is refused
        make_run(config, token_digest=digest).adopt_saved(saved(config.to_dict(), data_fingerprint(np.asarray(LENGTHS))))


def test_run_facts_are_resolved_once():
    """`resolve_run_facts`: the feature as given (or resolved per model), and whether weights can differ from 1 —
    below `data_fraction=1.0`, and at 1.0 under CluSTER's allocation (its per-rank weights), not otherwise."""
    from hf_cluster_select.run import resolve_run_facts

    model = torch.nn.Linear(3, 2)
    cases = [(ClusterSelectConfig(feature="badge", data_fraction=0.3), True),
             (ClusterSelectConfig(feature="badge", data_fraction=1.0), False),
             (ClusterSelectConfig.paper(data_fraction=1.0), True)]
    for config, weighted in cases:
        facts = resolve_run_facts(model, config, shift_labels=False, strata=["a", "b"], token_digest="t")
        assert facts.loss_weighted is weighted and facts.strata == ("a", "b") and facts.token_digest == "t"
        assert (facts.feature, facts.feature_layers, facts.feature_used) == (config.feature, None, config.feature)
    with pytest.raises(TypeError, match="`facts` must be a RunFacts"):
        SelectionRun(ClusterSelectConfig(), None, lengths=LENGTHS, world_size=1, per_device_batch_size=2,
                     gradient_accumulation_steps=1, num_train_epochs=1)
