"""Targeted selection: relevance scores, the exact-budget round-robin over target tasks, the coverage floor, weights,
the config and the errors raised before any model work, ClusterTrainer / ClusterSFTTrainer with a target set, the
feature cache of target features and the `select --target` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.registry import TARGET_RULES
from hf_cluster_select.selection import relevance_scores, select_targeted, target_self_relevance
from hf_cluster_select.settings import TargetSettings


def _blobs():
    """4 well-separated groups of 25 points in 6-D; 8 clusters = each group split in two halves."""
    rng = np.random.default_rng(0)
    centers = np.eye(6)[:4] * 5
    pool = np.concatenate([c + 0.2 * rng.normal(size=(25, 6)) for c in centers])
    group = np.repeat(np.arange(4), 25)
    labels = np.repeat(np.arange(8), [12, 13] * 4)
    return pool, group, labels, centers, rng


def test_relevance_is_the_max_cosine_per_task():
    pool = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    target = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    scores = relevance_scores(pool, target, [0, 0, 1])
    expected = np.array([[1.0, -1.0], [1.0, 0.0], [np.sqrt(0.5), -np.sqrt(0.5)]])
    assert np.allclose(scores, expected, atol=1e-6)
    with pytest.raises(ValueError, match="tasks"):
        relevance_scores(pool, target, [0, 2, 2])
    with pytest.raises(ValueError, match="target"):
        relevance_scores(pool, target[:, :1], [0, 0, 1])


def test_budget_goes_to_the_target_groups_in_equal_shares():
    pool, group, labels, centers, rng = _blobs()
    target = np.concatenate([centers[1] + 0.2 * rng.normal(size=(4, 6)), centers[3] + 0.2 * rng.normal(size=(4, 6))])
    scores = relevance_scores(pool, target, np.repeat([0, 1], 4))
    for rule in ("cluster_relevance", "top_k_cosine"):
        chosen, summary = select_targeted(labels, scores, data_fraction=0.3, settings=TargetSettings(target_rule=rule))
        assert chosen.n_kept == 30 and chosen.n_total == 100
        assert np.bincount(group[chosen.indices], minlength=4).tolist() == [0, 15, 0, 15]
        assert summary["kept_per_task"] == [15, 15] and summary["coverage_kept"] == 0
        assert np.allclose(chosen.loss_weights(), 1.0) and np.isclose(chosen.weights.sum(), 100)
        assert summary["mean_relevance_kept"] > summary["mean_relevance_pool"]


def test_coverage_floor_spreads_over_every_cluster_and_weights_stand_for_the_mixture():
    pool, group, labels, centers, rng = _blobs()
    scores = relevance_scores(pool, centers[[2]], [0])
    chosen, summary = select_targeted(labels, scores, data_fraction=0.4,
                                      settings=TargetSettings(target_coverage=0.2))
    assert chosen.n_kept == 40 and summary["coverage_kept"] == 8 and summary["kept_per_task"] == [32]
    assert set(chosen.labels.tolist()) == set(range(8))  # the floor reached every cluster
    # the target's 32 picks carry 100 · 32/40 in equal parts; the floor's 8 carry 20, one per cluster by its size
    target_picks = np.isclose(chosen.weights, 2.5)
    assert target_picks.sum() == 32 and np.allclose(sorted(chosen.weights[~target_picks]), [2.4] * 4 + [2.6] * 4)
    assert np.bincount(group[chosen.indices], minlength=4)[2] == 25  # all of the target's group


def test_cluster_relevance_takes_a_whole_relevant_cluster_where_top_k_takes_stray_points():
    # cluster 0: 10 points moderately near the target; cluster 1: 10 far points, 2 of them very near (strays)
    labels = np.repeat([0, 1], 10)
    scores = np.concatenate([np.full(10, 0.8), [0.99, 0.98] + [0.0] * 8])[:, None]
    settings = TargetSettings(target_rule="cluster_relevance")
    ours, _ = select_targeted(labels, scores, data_fraction=0.25, settings=settings)
    rds, _ = select_targeted(labels, scores, data_fraction=0.25, settings=TargetSettings(target_rule="top_k_cosine"))
    assert ours.indices.tolist() == [0, 1, 2, 3, 4]
    assert rds.indices.tolist() == [0, 1, 2, 10, 11]


def test_duplicates_take_one_slot_and_deferred_examples_come_last():
    labels = np.zeros(10, dtype=np.int64)
    scores = np.linspace(1.0, 0.1, 10)[:, None]
    groups = np.array([0, 0, 0, 1, 2, 3, 4, 5, 6, 7])  # rows 0-2 are copies
    deferred = np.zeros(10, dtype=bool)
    deferred[3] = True
    chosen, _ = select_targeted(labels, scores, data_fraction=0.3, settings=TargetSettings(), groups=groups,
                                deferred=deferred)
    assert chosen.indices.tolist() == [0, 4, 5]
    everything, _ = select_targeted(labels, scores, data_fraction=0.8, settings=TargetSettings(), groups=groups,
                                    deferred=deferred)
    assert everything.indices.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9][:8] or everything.n_kept == 8
    assert 3 not in everything.indices.tolist()  # the deferred example only when nothing else is left


def test_a_budget_that_covers_every_distinct_example_keeps_them_all_and_says_so():
    labels = np.zeros(8, dtype=np.int64)
    scores = np.array([[0.9, 0.1]] * 3 + [[0.1, 0.8]] * 5)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # 4 distinct rows, budget 4
    chosen, summary = select_targeted(labels, scores, data_fraction=0.5, settings=TargetSettings(), groups=groups)
    assert chosen.indices.tolist() == [0, 2, 4, 6] and np.allclose(chosen.weights, 2.0)
    assert summary["all_distinct_kept"] is True and summary["kept_per_task"] == [2, 2]
    with pytest.raises(ValueError, match="smaller than the number of target tasks"):
        select_targeted(np.zeros(20, dtype=np.int64), np.zeros((20, 3)), data_fraction=0.1, settings=TargetSettings())


def test_a_registered_rule_is_used_and_checked():
    @TARGET_RULES.register("reverse_for_test")
    def reverse(scores, labels, rng, **_):
        return np.arange(scores.size)[::-1]

    @TARGET_RULES.register("broken_for_test")
    def broken(scores, labels, rng, **_):
        return np.zeros(scores.size, dtype=np.int64)

    labels, scores = np.zeros(10, dtype=np.int64), np.zeros((10, 1))
    chosen, _ = select_targeted(labels, scores, data_fraction=0.2, settings=TargetSettings(target_rule="reverse_for_test"))
    assert chosen.indices.tolist() == [8, 9]
    with pytest.raises(ValueError, match="permutation"):
        select_targeted(labels, scores, data_fraction=0.2, settings=TargetSettings(target_rule="broken_for_test"))


def test_config_takes_target_settings_and_refuses_bad_ones():
    config = ClusterSelectConfig(target="eval", strategy_kwargs={"target_coverage": 0.1, "target_column": "task"})
    assert config.target_settings == TargetSettings(target_coverage=0.1, target_column="task")
    assert config.resolved()["target_rule"] == "top_k_cosine"
    assert ClusterSelectConfig.from_flat(config.resolved()) == config
    assert ClusterSelectConfig(target="None").target is None
    with pytest.raises(ValueError, match="`target` must be one of"):
        ClusterSelectConfig(target="test")
    with pytest.raises(ValueError, match="target_coverage"):
        ClusterSelectConfig(strategy_kwargs={"target_coverage": 1.0})
    with pytest.raises(ValueError, match="target_rule"):
        ClusterSelectConfig(strategy_kwargs={"target_rule": "nearest"})
    with pytest.raises(ValueError, match="allocation"):
        ClusterSelectConfig.paper(target="eval")
    with pytest.raises(ValueError, match="stratify_column"):
        ClusterSelectConfig(target="eval", stratify_column="source")
    with pytest.raises(ValueError, match="nothing to choose"):
        ClusterSelectConfig(target="eval", data_fraction=1.0)


# ---- with a trainer ----------------------------------------------------------------------------------------------
def _args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                  num_train_epochs=1, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
                  use_cpu=True, seed=0, disable_tqdm=True)
    values.update(overrides)
    return TrainingArguments(**values)


def _trainer(tmp_path, tiny_lm, lm_dataset, collator, config=None, **kwargs):
    config = config or ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=0)
    return ClusterTrainer(model=tiny_lm, args=_args(tmp_path), train_dataset=lm_dataset, data_collator=collator,
                          cluster_config=config, **kwargs)


def test_trainer_aims_the_selection_at_the_target(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    import hf_cluster_select.pipeline as pipeline

    computed = []  # the thresholds the pipeline computed, to check the report carries exactly them
    original = pipeline.target_self_relevance
    monkeypatch.setattr(pipeline, "target_self_relevance", lambda *a, **k: computed.append(original(*a, **k))
                        or computed[-1])
    target = lm_dataset.select(range(8)).add_column("task", ["x"] * 4 + ["y"] * 4)
    config = ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=0,
                                 strategy_kwargs={"target_column": "task", "target_rule": "top_k_cosine"})
    trainer = _trainer(tmp_path, tiny_lm, lm_dataset, collator, config, target_dataset=target)
    trainer.train()
    report = trainer.selection_report
    assert report.n_kept == 24 and report.target["task_names"] == ["x", "y"]
    assert report.target["kept_per_task"] == [12, 12] and report.target["n_target_per_task"] == [4, 4]
    assert report.target["source"] == "target_dataset" and report.target["features_from_cache"] is False
    assert set(range(8)) <= set(report.kept_indices)  # top-k cosine keeps the target rows themselves (cosine 1)
    assert len(computed) == 1 and computed[0].shape == (2,) and np.isfinite(computed[0]).all()
    assert report.target["self_relevance"] == [round(float(t), 4) for t in computed[0]]
    trainer.save_model()
    card = open(tmp_path / "out" / "README.md", encoding="utf-8").read()
    assert "| Target set | 8 examples in 2 task(s) from target_dataset |" in card
    assert "x: 4 target, 12 kept; y: 4 target, 12 kept" in card


def test_target_eval_uses_every_eval_set_as_a_task_and_caches_target_features(tmp_path, tiny_lm, lm_dataset,
                                                                              collator, _tiny_lm_base):
    import copy

    evals = {"first": lm_dataset.select(range(3)), "second": lm_dataset.select(range(50, 53))}
    config = ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=0, target="eval")
    runs = []
    for model in (tiny_lm, copy.deepcopy(_tiny_lm_base)):
        trainer = _trainer(tmp_path, model, lm_dataset, collator, config, eval_dataset=evals)
        trainer.train()
        runs.append(trainer.selection_report)
    assert runs[0].target["task_names"] == ["first", "second"] and runs[0].target["source"] == "eval_dataset"
    assert runs[0].target["features_from_cache"] is False and runs[1].target["features_from_cache"] is True
    assert runs[0].kept_indices == runs[1].kept_indices
    other = _trainer(tmp_path, copy.deepcopy(_tiny_lm_base), lm_dataset, collator, config,
                     eval_dataset={"first": lm_dataset.select(range(10, 13))})
    other.train()  # another target: its features are not the cached ones, the pool's are
    assert other.selection_report.target["features_from_cache"] is False
    assert other.selection_report.features_from_cache is True


@pytest.mark.parametrize("case, message", [
    ("empty", "is empty"),
    ("missing_column", "`target_column` 'task' is not a column"),
    ("one_value", r"has one value \('a'\)"),
    ("missing_value", "has no value in 2 of the 4 rows"),
    ("raw_text", "lacks the column"),
    ("full_fraction", "nothing to choose"),
    ("too_many_tasks", "some tasks would get nothing"),
    ("splits", "must be one dataset"),
    ("empty_eval_part", r"`eval_dataset\['b'\]` is empty"),
    ("other_format", "lacks the column"),
    ("no_loss", "no loss-bearing token"),
    ("paper", "allocation"),
    ("stratified", "stratify_column"),
    ("both", "give the target once"),
    ("eval_missing", "needs the trainer's `eval_dataset`"),
    ("settings_only", "has no target"),
])
def test_bad_targets_fail_before_any_model_work(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch, case, message):
    from hf_cluster_select import pipeline

    def no_features(*args, **kwargs):
        raise AssertionError("model work started")

    monkeypatch.setattr(pipeline, "cached_or_computed_features", no_features)
    kwargs = dict(strategy_kwargs={"target_column": "task"})
    rows = lm_dataset.select(range(4))
    target = rows.add_column("task", ["a", "a", "b", "b"])
    trainer_kwargs = {"target_dataset": target}
    if case == "empty":
        trainer_kwargs["target_dataset"] = target.select([])
    elif case == "missing_column":
        trainer_kwargs["target_dataset"] = rows
    elif case == "one_value":
        trainer_kwargs["target_dataset"] = rows.add_column("task", ["a"] * 4)
    elif case == "missing_value":
        trainer_kwargs["target_dataset"] = rows.add_column("task", ["a", None, "b", None])
    elif case == "raw_text":
        from datasets import Dataset

        trainer_kwargs["target_dataset"] = Dataset.from_dict({"text": ["one", "two"], "task": ["a", "b"]})
    elif case == "full_fraction":
        kwargs.update(data_fraction=1.0)
    elif case == "too_many_tasks":
        kwargs.update(data_fraction=0.05)  # 5 of 96 examples for 6 tasks
        trainer_kwargs["target_dataset"] = lm_dataset.select(range(6)).add_column("task", list("abcdef"))
    elif case == "splits":
        from datasets import DatasetDict

        trainer_kwargs["target_dataset"] = DatasetDict({"train": target})
    elif case == "empty_eval_part":
        kwargs.update(target="eval")
        kwargs["strategy_kwargs"] = {}
        trainer_kwargs = {"eval_dataset": {"a": rows, "b": rows.select([])}}
    elif case == "other_format":
        trainer_kwargs["target_dataset"] = target.remove_columns("labels")
    elif case == "no_loss":
        trainer_kwargs["target_dataset"] = target.map(lambda r: {"labels": [-100] * len(r["labels"])})
    elif case == "paper":
        kwargs.update(allocation="paper")
    elif case == "stratified":
        kwargs.update(stratify_column="input_ids")
    elif case == "both":
        kwargs.update(target="eval")
        trainer_kwargs["eval_dataset"] = rows
    elif case == "eval_missing":
        kwargs.update(target="eval")
        trainer_kwargs = {}
    elif case == "settings_only":
        trainer_kwargs = {}
    kwargs = {"data_fraction": 0.25, **kwargs}
    config = ClusterSelectConfig(selection_warmup_steps=0, **kwargs)
    trainer = _trainer(tmp_path, tiny_lm, lm_dataset, collator, config, **trainer_kwargs)
    with pytest.raises(ValueError, match=message):
        trainer.train()


def test_select_command_with_a_target_file(tmp_path, tokenizer, _tiny_lm_base):
    from hf_cluster_select.commands import main

    model_dir = tmp_path / "model"
    _tiny_lm_base.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    import tiny_assets

    texts = tiny_assets.make_texts(40)
    data, target = tmp_path / "data.jsonl", tmp_path / "target.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    target.write_text("\n".join(json.dumps({"text": t, "kind": k}) for t, k in zip(texts[:4], "aabb")))
    out = tmp_path / "selected"
    code = main(["select", "--model", str(model_dir), "--dataset", str(data), "--text-column", "text",
                 "--target", str(target), "--target-column", "kind", "--data-fraction", "0.5", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "selection_report.json").read_text())
    assert report["target"]["kept_per_task"] == [10, 10] and report["target"]["source"] == str(target)
    clusters = json.loads((out / "clusters.json").read_text())
    assert all(isinstance(c["relevance"], float) for c in clusters)
    from hf_cluster_select.commands import format_report

    assert "kept per task a 10, b 10, coverage floor 0" in format_report(str(out))
    bad = main(["select", "--model", str(model_dir), "--dataset", str(data), "--text-column", "text",
                "--target-column", "kind", "--output", str(tmp_path / "other")])
    assert bad == 2


def test_select_command_names_target_options_in_its_errors(tmp_path, capsys):
    from hf_cluster_select.commands import main

    code = main(["select", "--model", str(tmp_path), "--dataset", "x.jsonl", "--text-column", "text",
                 "--target-coverage", "1.0", "--output", str(tmp_path / "o")])
    assert code == 2
    assert "`--target-coverage` must be a float in [0, 1), got 1.0" in capsys.readouterr().err


def test_resume_refuses_a_selection_made_for_another_target(tmp_path, lm_dataset, collator, _tiny_lm_base):
    import copy

    config = ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=0)
    target = lm_dataset.select(range(4))
    args = _args(tmp_path, save_strategy="steps", save_steps=2, num_train_epochs=2)
    first = ClusterTrainer(model=copy.deepcopy(_tiny_lm_base), args=args, train_dataset=lm_dataset,
                           data_collator=collator, cluster_config=config, target_dataset=target)
    first.train()
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    for other in (lm_dataset.select(range(10, 14)), None):
        again = ClusterTrainer(model=copy.deepcopy(_tiny_lm_base), args=args, train_dataset=lm_dataset,
                               data_collator=collator, cluster_config=config, target_dataset=other)
        with pytest.raises(ValueError, match="another target set" if other is not None else "this run has none"):
            again.train(resume_from_checkpoint=checkpoint)
    same = ClusterTrainer(model=copy.deepcopy(_tiny_lm_base), args=args, train_dataset=lm_dataset,
                          data_collator=collator, cluster_config=config, target_dataset=target)
    same.train(resume_from_checkpoint=checkpoint)
    assert same.selection.indices.tolist() == first.selection.indices.tolist()


def test_self_relevance_is_the_quantile_of_nearest_target_neighbours():
    target = np.array([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0], [1.0, 1.0]])
    tasks = np.array([0, 0, 0, 0, 1])
    # task 0's nearest-neighbour cosines: 0.8, 0.96, 0.96, 0.8 -> 25th percentile 0.8; task 1 has one example
    got = target_self_relevance(target, tasks)
    assert got[0] == pytest.approx(0.8) and got[1] == np.inf
    assert target_self_relevance(target, tasks, quantile=1.0)[0] == pytest.approx(0.96)
    with pytest.raises(ValueError, match="tasks"):
        target_self_relevance(target, tasks[:3])


def test_relevant_sample_draws_from_the_region_then_follows_relevance():
    scores = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.5, 0.4, 0.3, 0.2])
    labels = np.zeros(10, dtype=np.int64)
    rule = TARGET_RULES.get("relevant_sample")
    # region: scores >= 0.9 → 6 candidates, capped at 2 · share = 4 (the 4 most relevant), in a seeded random order
    order = rule(scores, labels, np.random.default_rng(0), share=2, threshold=0.9)
    assert sorted(order[:4].tolist()) == [0, 1, 2, 3] and order[4:].tolist() == [4, 5, 6, 7, 8, 9]
    assert order[:4].tolist() == np.random.default_rng(0).permutation([0, 1, 2, 3]).tolist()
    # a region smaller than the share (or no threshold) is the share's nearest: top_k_cosine exactly
    for threshold in (0.97, np.inf):
        assert rule(scores, labels, np.random.default_rng(0), share=3, threshold=threshold).tolist() == list(range(10))


def test_select_targeted_passes_each_task_its_threshold_and_share():
    seen = []

    @TARGET_RULES.register("record_for_test")
    def record(scores, labels, rng, *, share, threshold):
        seen.append((share, threshold))
        return np.lexsort((np.arange(scores.size), -scores))

    scores = np.random.default_rng(1).random((40, 2))
    settings = TargetSettings(target_rule="record_for_test")
    select_targeted(np.zeros(40, dtype=np.int64), scores, data_fraction=0.25, settings=settings, thresholds=[0.3, 0.7])
    assert seen == [(5, 0.3), (5, 0.7)]  # budget 10 over 2 tasks
    with pytest.raises(ValueError, match="thresholds"):
        select_targeted(np.zeros(40, dtype=np.int64), scores, data_fraction=0.25, settings=settings, thresholds=[0.3])


def test_targeted_inputs_are_checked_with_errors_that_name_them():
    labels, scores = np.zeros(20, dtype=np.int64), np.random.default_rng(0).random((20, 2))
    settings = TargetSettings()
    for bad in ([[0.5], [0.5]], [0.5], [0.5, np.nan], ["a", "b"]):
        with pytest.raises(ValueError, match="thresholds"):
            select_targeted(labels, scores, data_fraction=0.5, settings=settings, thresholds=bad)
    with pytest.raises(TypeError, match="settings"):
        select_targeted(labels, scores, data_fraction=0.5, settings={"target_rule": "top_k_cosine"})
    for name in ("deferred", "groups"):
        with pytest.raises(ValueError, match=name):
            select_targeted(labels, scores, data_fraction=0.5, settings=settings, **{name: np.zeros(21, dtype=int)})
    with pytest.raises(ValueError, match="integer task ids"):
        target_self_relevance(np.eye(2), [0.5, 1.5])
    with pytest.raises(ValueError, match="every id"):
        target_self_relevance(np.eye(3), [0, 2, 2])
    with pytest.raises(ValueError, match="quantile"):
        target_self_relevance(np.eye(2), [0, 0], quantile=1.5)
    with pytest.raises(ValueError, match="empty"):
        target_self_relevance(np.zeros((0, 2)), [])
    with pytest.raises(ValueError, match="chunk_rows"):
        relevance_scores(np.eye(2), np.eye(2), [0, 1], chunk_rows=0)


def test_a_rule_that_breaks_the_protocol_is_named():
    labels, scores = np.zeros(10, dtype=np.int64), np.random.default_rng(0).random((10, 1))
    bad_orders = {"negative_for_test": lambda n: np.r_[np.arange(n - 1), -n],
                  "out_of_range_for_test": lambda n: np.arange(1, n + 1),
                  "float_for_test": lambda n: np.arange(n, dtype=float),
                  "two_d_for_test": lambda n: np.arange(n)[None, :]}
    for name, make in bad_orders.items():
        TARGET_RULES.register(name)(lambda scores, labels, rng, make=make, **_: make(scores.size))
        with pytest.raises(ValueError, match=f"{name}.*permutation of 0..9"):
            select_targeted(labels, scores, data_fraction=0.2, settings=TargetSettings(target_rule=name))
    TARGET_RULES.register("old_protocol_for_test")(lambda scores, labels, rng: np.arange(scores.size))
    with pytest.raises(TypeError, match="old_protocol_for_test.*share"):
        select_targeted(labels, scores, data_fraction=0.2, settings=TargetSettings(target_rule="old_protocol_for_test"))
