"""`ClusterSelectConfig(order="easy_to_hard")` below the Trainer (batching/curriculum.py): the plan orders each
cluster easy to hard while every step keeps the shuffled plan's cluster mix, the sampler and the run carry the
difficulty, the config validates and round-trips the field, and a saved selection keeps the difficulty."""

from __future__ import annotations

import logging
import os
from collections import Counter

import numpy as np
import pytest
import tiny_assets
from accelerate.data_loader import BatchSamplerShard
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_cluster_select import ClusterSelectConfig, Selection, SelectionRun
from hf_cluster_select.batching.curriculum import resolve_difficulty
from hf_cluster_select.batching.plan import batches_per_rank, mixed_order, plan_epoch
from hf_cluster_select.batching.sampler import ClusterBatchSampler
from hf_cluster_select.persistence import (SavedSelection, config_differences, load_selection, save_selection,
                                           validate_saved_selection)

LABELS = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]
LENGTHS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]
DIFFICULTY = [3.0, 1.0, 4.0, 2.0, 0.5, 6.0, 5.0, 2.5, 1.5, 3.5, 9.0, 8.0]


def steps_of(plan, world_size):
    """Micro-step `j` = the union of batches `[j·W, (j+1)·W)` (accelerate deals batch k to rank k % W)."""
    return [[p for batch in plan[j:j + world_size] for p in batch] for j in range(0, len(plan), world_size)]


# ---- the plan ---------------------------------------------------------------------------------------------------
def test_literal_easy_to_hard_plan():
    # Shuffled (test_plan.py): order 9 2 7 0 6 11 8 1 5 3 4 10. Easy to hard keeps the cluster of every slot
    # (1 0 1 0 1 2 1 0 1 0 1 2) and fills each cluster's slots by difficulty: cluster 0 (1, 3, 0, 2), cluster 1
    # (4, 8, 7, 9, 6, 5), cluster 2 (11, 10).
    rng = np.random.default_rng(0)
    assert mixed_order(np.array(LABELS), rng, np.array(DIFFICULTY)).tolist() == [4, 1, 8, 3, 7, 11, 9, 0, 6, 2, 5, 10]
    common = dict(world_size=2, per_device_batch_size=2, seed=0, epoch=0, window=2, balance_tokens=False)
    shuffled = plan_epoch(LABELS, LENGTHS, **common)
    assert shuffled == [[9, 2], [7, 0], [6, 11], [8, 1], [4, 3], [10, 5]]  # unchanged by the new argument
    assert plan_epoch(LABELS, LENGTHS, difficulty=None, **common) == shuffled
    # Each step is the next slice of 4 of the order, permuted as the shuffled plan's step (same random draws).
    assert plan_epoch(LABELS, LENGTHS, difficulty=DIFFICULTY, **common) == [
        [4, 1], [8, 3], [7, 11], [9, 0], [5, 2], [10, 6]
    ]


def test_ties_keep_the_shuffled_plan():
    """Equal difficulties leave the seeded shuffle as it is, so the random stream (cluster priorities, step shuffles,
    token-budget dealing) is the shuffled plan's: the same plan, fixed-size and token-balanced."""
    rng = np.random.default_rng(4)
    labels, lengths = rng.integers(0, 5, 300), rng.integers(5, 400, 300)
    for balance in (False, True):
        common = dict(world_size=3, per_device_batch_size=4, seed=11, epoch=2, balance_tokens=balance)
        assert plan_epoch(labels, lengths, difficulty=np.full(300, 2.0), **common) == plan_epoch(labels, lengths,
                                                                                                  **common)


@st.composite
def curricula(draw):
    m = draw(st.integers(1, 250))
    n_clusters = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    labels = rng.choice(n_clusters, size=m, p=rng.dirichlet(np.full(n_clusters, 1.0))) * 3 - 1
    difficulty = np.round(rng.gamma(2.0, 1.0, m), draw(st.sampled_from([1, 6])))  # 1 decimal: many ties
    return labels, rng.integers(1, 300, m), difficulty, seed


@settings(max_examples=80, deadline=None)
@given(curricula(), st.integers(1, 5), st.integers(1, 5), st.integers(0, 3))
def test_easy_to_hard_plan_invariants(curriculum, world_size, batch_size, epoch):
    labels, lengths, difficulty, seed = curriculum
    m = len(labels)
    common = dict(world_size=world_size, per_device_batch_size=batch_size, seed=seed, epoch=epoch,
                  balance_tokens=False)
    plan = plan_epoch(labels, lengths, difficulty=difficulty, **common)
    shuffled = plan_epoch(labels, lengths, **common)
    groups = batches_per_rank(m, world_size, batch_size)
    assert len(plan) == groups * world_size and [len(b) for b in plan] == [len(b) for b in shuffled]
    counts = Counter(p for b in plan for p in b)
    assert set(counts) == set(range(m))
    if m >= groups * world_size:
        assert set(counts.values()) == {1}  # every position once
    steps, plain = steps_of(plan, world_size), steps_of(shuffled, world_size)
    for step, other in zip(steps, plain):  # the shuffled plan's cluster counts, step by step
        assert Counter(labels[step].tolist()) == Counter(labels[other].tolist())
    if m < groups * world_size:
        return  # the documented pad repeats the start of the order: easiest first again
    clusters, sizes = np.unique(labels, return_counts=True)
    held = np.cumsum([[np.sum(labels[s] == c) for c in clusters] for s in steps], axis=0)
    done = np.cumsum([len(s) for s in steps])[:, None]
    assert np.abs(held - done * sizes / m).max() < 1  # every prefix of steps: each cluster strictly within 1
    for c in clusters:  # each cluster's stream runs easy to hard: a later step never holds an easier member
        per_step = [difficulty[[p for p in s if labels[p] == c]] for s in steps]
        per_step = [d for d in per_step if d.size]
        assert all(a.max() <= b.min() for a, b in zip(per_step, per_step[1:]))
        assert np.all(np.diff([d.mean() for d in per_step]) >= -1e-12)  # so the step means rise (to rounding)


def test_token_balanced_plan_keeps_the_order_approximately():
    """Token-budget steps take examples from a look-ahead of `window + 1` steps of the order: by length within it,
    so the order holds on the scale of the look-ahead, and every step keeps the cluster mix."""
    rng = np.random.default_rng(2)
    m, w, b, window = 4000, 4, 4, 4
    labels = rng.choice(5, size=m, p=[0.4, 0.25, 0.15, 0.12, 0.08])
    lengths = np.clip(np.round(rng.lognormal(np.log(90), 0.7, m)), 20, 400).astype(np.int64)
    difficulty = rng.gamma(2.0, 1.0, m)
    common = dict(world_size=w, per_device_batch_size=b, seed=0, epoch=0, window=window)
    steps = steps_of(plan_epoch(labels, lengths, difficulty=difficulty, **common), w)
    assert sorted(p for s in steps for p in s) == list(range(m))
    means = np.array([difficulty[s].mean() for s in steps])
    assert np.corrcoef(np.arange(len(means)), means)[0, 1] > 0.9
    tenth = len(means) // 10
    assert means[:tenth].max() < means[-tenth:].min()  # the first tenth of the epoch is easier than the last
    shuffled = np.array([difficulty[s].mean() for s in steps_of(plan_epoch(labels, lengths, **common), w)])
    assert abs(np.corrcoef(np.arange(len(shuffled)), shuffled)[0, 1]) < 0.2
    share = np.bincount(labels) / m
    held = np.cumsum([np.bincount(labels[s], minlength=5) for s in steps], axis=0)
    assert np.abs(held - held.sum(axis=1, keepdims=True) * share).max() <= (window + 1) * w * b + 1


def test_every_epoch_runs_easy_to_hard_again():
    labels, difficulty = np.arange(40) % 2, np.linspace(0.0, 1.0, 40)
    for epoch in range(3):
        plan = plan_epoch(labels, np.full(40, 8), world_size=2, per_device_batch_size=2, seed=1, epoch=epoch,
                          difficulty=difficulty, balance_tokens=False)
        for c in (0, 1):
            ordered = [p for s in steps_of(plan, 2) for p in sorted(s, key=difficulty.__getitem__) if labels[p] == c]
            assert ordered == sorted(ordered, key=difficulty.__getitem__)
            assert ordered[0] == c and ordered[-1] == 38 + c


def test_difficulty_is_checked():
    for bad in ([1.0, 2.0], ["a"] * 12, np.zeros((12, 1))):
        with pytest.raises(ValueError, match="`difficulty` must be a float array"):
            plan_epoch(LABELS, LENGTHS, world_size=2, per_device_batch_size=2, seed=0, epoch=0, difficulty=bad)
    nan_last = plan_epoch([0] * 4, [1] * 4, world_size=1, per_device_batch_size=1, seed=0, epoch=0,
                          difficulty=[np.nan, 2.0, 1.0, np.inf], balance_tokens=False)
    assert nan_last == [[2], [1], [3], [0]]


# ---- the sampler, as accelerate shards it ---------------------------------------------------------------------
def test_sampler_carries_the_difficulty_to_every_rank():
    indices = np.arange(100, 112)
    sampler = ClusterBatchSampler(indices, LABELS, LENGTHS, world_size=2, per_device_batch_size=2, seed=0,
                                  balance_tokens=False, difficulty=DIFFICULTY)
    assert sampler.plan(0) == plan_epoch(LABELS, LENGTHS, world_size=2, per_device_batch_size=2, seed=0, epoch=0,
                                         difficulty=DIFFICULTY, balance_tokens=False)
    per_rank = [list(BatchSamplerShard(sampler, num_processes=2, process_index=r, split_batches=False))
                for r in range(2)]
    assert per_rank == [[[104, 101], [107, 111], [105, 102]], [[108, 103], [109, 100], [110, 106]]]
    plain = ClusterBatchSampler(indices, LABELS, LENGTHS, world_size=2, per_device_batch_size=2, seed=0,
                                balance_tokens=False)
    assert plain.difficulty is None and list(plain) != list(sampler)
    with pytest.raises(ValueError, match="`difficulty`"):
        ClusterBatchSampler(indices, LABELS, LENGTHS, world_size=2, per_device_batch_size=2, difficulty=[1.0])
    with pytest.raises(ValueError, match="one cluster per rank"):
        ClusterBatchSampler(indices, [0, 1] * 6, LENGTHS, world_size=2, per_device_batch_size=2, allocation="paper",
                            difficulty=DIFFICULTY)


# ---- the config -----------------------------------------------------------------------------------------------
def test_config_field_validates_and_round_trips(tmp_path):
    assert ClusterSelectConfig().order == "shuffled"
    config = ClusterSelectConfig(data_fraction=0.2, order="easy_to_hard")
    assert ClusterSelectConfig.from_dict(config.to_dict()) == config
    assert ClusterSelectConfig.from_json(config.to_json()) == config
    assert ClusterSelectConfig.from_flat(config.resolved()) == config
    assert config.resolved()["order"] == "easy_to_hard"
    with pytest.raises(ValueError, match=r"`order` must be one of \['shuffled', 'easy_to_hard'\], got 'hard_first'"):
        ClusterSelectConfig(order="hard_first")
    with pytest.raises(ValueError, match=r"`order`='easy_to_hard' needs `allocation`='balanced'.*allocation='paper'"):
        ClusterSelectConfig.paper(order="easy_to_hard")
    with pytest.raises(ValueError, match=r"`order`='easy_to_hard'.*data_fraction=1\.0"):
        ClusterSelectConfig(data_fraction=1.0, order="easy_to_hard")
    from transformers import HfArgumentParser, TrainingArguments

    _, parsed = HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none", "--order", "easy_to_hard"])
    assert parsed == ClusterSelectConfig(order="easy_to_hard")
    with pytest.raises(SystemExit):  # a choices field: argparse refuses
        HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--order", "hard_first"])
    from hf_cluster_select.commands import build_parser, config_from_args

    base = ["select", "--model", "m", "--dataset", "d", "--output", "o"]
    assert config_from_args(build_parser().parse_args(base + ["--order", "easy_to_hard"])).order == "easy_to_hard"
    assert config_from_args(build_parser().parse_args(base)).order == "shuffled"


def test_order_is_not_a_selection_setting():
    """A checkpoint's selection resumes under another order (batch order only), as under another `balance_tokens`."""
    saved = ClusterSelectConfig(data_fraction=0.5).to_dict()
    assert config_differences(saved, ClusterSelectConfig(data_fraction=0.5, order="easy_to_hard").to_dict()) == []
    older = {k: v for k, v in saved.items() if k != "order"}  # a config saved before the field existed
    assert ClusterSelectConfig.from_dict(older).order == "shuffled"
    assert config_differences(older, ClusterSelectConfig(data_fraction=0.5, order="easy_to_hard").to_dict()) == []


def test_resolve_difficulty():
    assert resolve_difficulty("shuffled", [1.0]) == (None, "shuffled", None)
    difficulty, used, fallback = resolve_difficulty("easy_to_hard", [1.0, 2.0])
    assert difficulty.tolist() == [1.0, 2.0] and used == "easy_to_hard" and fallback is None
    difficulty, used, fallback = resolve_difficulty("easy_to_hard", None)
    assert difficulty is None and used == "shuffled" and fallback.startswith("order='easy_to_hard' fell back")
    with pytest.raises(ValueError, match="`order`"):
        resolve_difficulty("random", None)


# ---- the run and the saved selection --------------------------------------------------------------------------
N, KEPT = 40, np.arange(0, 40, 2)
ALL_LABELS = (np.arange(N) // 10).astype(np.int64)  # 4 clusters of 10, 5 kept each


def make_run(order="easy_to_hard"):
    """A run of 40 examples on 2 ranks with fixed-size steps (the order exact, not by a token look-ahead)."""
    config = ClusterSelectConfig(data_fraction=0.5, order=order, strategy_kwargs={"balance_tokens": False})
    return SelectionRun(config, tiny_assets.run_facts(),
                        lengths=[3 + (i % 5) for i in range(N)], world_size=2, per_device_batch_size=2,
                        gradient_accumulation_steps=1, num_train_epochs=2, lr_warmup_steps=0)


def selection():
    return Selection(indices=KEPT, weights=np.full(20, 2.0), labels=ALL_LABELS[KEPT], n_total=N)


def kept_difficulty():
    return np.random.default_rng(0).permutation(20) / 4.0  # distinct losses, none in dataset order


def test_run_plans_by_the_kept_difficulty_and_saves_it(tmp_path):
    run = make_run()
    run.adopt(selection(), ALL_LABELS, ALL_LABELS, difficulty=kept_difficulty())
    assert run.batch_order == "easy_to_hard" and run.batch_order_fallback is None
    sampler = run.sampler_for(1)
    by_index = dict(zip(KEPT.tolist(), kept_difficulty()))
    streams = {c: [] for c in range(4)}
    for step in steps_of(list(sampler), 2):
        for i in sorted(step, key=by_index.get):
            streams[int(ALL_LABELS[i])].append(by_index[i])
    assert all(s == sorted(s) and len(s) == 5 for s in streams.values())
    assert run.save(str(tmp_path)) is not None
    saved = load_selection(str(tmp_path))
    np.testing.assert_array_equal(saved.difficulty, kept_difficulty())
    resumed = make_run()
    resumed.adopt_saved(saved)
    assert [list(resumed.sampler_for(e)) for e in (1, 2)] == [list(run.sampler_for(e)) for e in (1, 2)]
    shuffled = make_run("shuffled")
    shuffled.adopt_saved(saved)  # another order: the same selection, batches of the shuffled plan
    assert shuffled.batch_order == "shuffled" and shuffled.subset_sampler.difficulty is None
    np.testing.assert_array_equal(shuffled.difficulty, kept_difficulty())  # kept, and saved again
    assert list(shuffled.sampler_for(1)) != list(run.sampler_for(1))


def test_shuffled_run_is_unchanged_and_an_older_selection_resumes(tmp_path, caplog):
    """A selection saved without the difficulty (older versions) resumes as before under `order="shuffled"`; under
    `"easy_to_hard"` the run trains shuffled, says so in the log and in the report."""
    save_selection(str(tmp_path), selection(), labels=ALL_LABELS, raw_labels=ALL_LABELS,
                   config=ClusterSelectConfig(data_fraction=0.5).to_dict(), fingerprint=make_run().fingerprint)
    with np.load(os.path.join(tmp_path, "cluster_selection.npz")) as data:
        assert "difficulty" not in data.files
    saved = load_selection(str(tmp_path))
    assert saved.difficulty is None
    plain = make_run("shuffled")
    plain.adopt_saved(saved)
    with_loss = make_run("shuffled")
    with_loss.adopt(selection(), ALL_LABELS, ALL_LABELS, difficulty=kept_difficulty())
    assert list(plain.sampler_for(1)) == list(with_loss.sampler_for(1))  # shuffled: the difficulty is not read
    reference = ClusterBatchSampler(KEPT, ALL_LABELS[KEPT], plain.lengths[KEPT], world_size=2,
                                    per_device_batch_size=2, seed=42, balance_tokens=False)
    reference.set_epoch(1)
    assert list(plain.sampler_for(1)) == list(reference)  # the sampler as it was built before the field existed
    curriculum = make_run()
    with caplog.at_level(logging.WARNING, logger="hf_cluster_select.run"):
        curriculum.adopt_saved(saved)
    assert "order='easy_to_hard' fell back to 'shuffled'" in caplog.text
    assert curriculum.batch_order == "shuffled" and curriculum.batch_order_fallback.startswith("order='easy_to_hard'")
    assert list(curriculum.sampler_for(1)) == list(plain.sampler_for(1))


def test_saved_difficulty_is_validated():
    run = make_run()

    def saved(difficulty):
        return SavedSelection(selection(), ALL_LABELS, ALL_LABELS, ClusterSelectConfig(data_fraction=0.5).to_dict(),
                              run.fingerprint, {}, difficulty=difficulty)

    validate_saved_selection(saved(kept_difficulty()))
    validate_saved_selection(saved(np.r_[kept_difficulty()[:-1], np.nan]))  # a NaN loss sorts last
    with pytest.raises(ValueError, match="`difficulty` must hold n_kept = 20 entries; found 19"):
        validate_saved_selection(saved(kept_difficulty()[:-1]))
    with pytest.raises(ValueError, match="`difficulty` must hold floats; found dtype int64"):
        validate_saved_selection(saved(np.arange(20)))
    with pytest.raises(ValueError, match="`difficulty`"):
        run.adopt(selection(), ALL_LABELS, ALL_LABELS, difficulty=np.ones(19))
    assert run.selection is None
