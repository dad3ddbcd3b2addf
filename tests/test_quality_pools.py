"""The noisy / redundant pools of `benchmarks/quality_pools.py`, the equal-cost table of `benchmarks/pareto.py` and
the gain-against-rate table of `benchmarks/rate_gain.py`, on small synthetic tasks (no model is trained)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
datasets = pytest.importorskip("datasets")

import pareto  # noqa: E402
import quality_pools  # noqa: E402
import rate_gain  # noqa: E402
from quality_tasks import Task  # noqa: E402


def _task(sft: bool, n: int = 40, n_groups: int = 4) -> Task:
    rows, groups = [], np.arange(n) % n_groups
    for i in range(n):
        prompt = [100 + i, 200 + i, 300 + i, 400 + i, 500 + i]
        if sft:
            reply = [1000 * (groups[i] + 1) + i, 7]
            rows.append({"input_ids": prompt + reply, "labels": [-100] * 5 + reply, "attention_mask": [1] * 7})
        else:
            rows.append({"input_ids": [1, *prompt, 2], "attention_mask": [1] * 7, "labels": int(groups[i])})
    return Task("toy", datasets.Dataset.from_list(rows), None, groups, n_groups, None, None, {}, None, "m", True)


def test_label_noise_flips_the_share_of_labels_to_another_class():
    clean = _task(sft=False)
    noisy = quality_pools.corrupted(clean, label_noise=0.25)
    before, after = np.asarray(clean.train["labels"]), np.asarray(noisy.train["labels"])
    assert noisy.name == "toy_noise25" and len(noisy.train) == 40
    assert int((before != after).sum()) == 10  # round(0.25 * 40), each to another class
    assert after.min() >= 0 and after.max() < 4
    assert np.array_equal(noisy.groups_train, after)
    assert np.array_equal(noisy.corrupted, before != after) and clean.corrupted is None
    assert noisy.train["input_ids"] == clean.train["input_ids"]


def test_reply_swap_keeps_the_prompt_and_takes_another_skills_reply():
    clean = _task(sft=True)
    noisy = quality_pools.corrupted(clean, label_noise=0.5)
    changed = [i for i in range(40) if noisy.train[i]["labels"] != clean.train[i]["labels"]]
    assert len(changed) == 20 and np.flatnonzero(noisy.corrupted).tolist() == changed
    for i in changed:
        row = noisy.train[i]
        assert row["input_ids"][:5] == clean.train[i]["input_ids"][:5] and row["labels"][:5] == [-100] * 5
        reply = row["labels"][5:]
        donor = next(j for j in range(40) if clean.train[j]["labels"][5:] == reply)
        assert clean.groups_train[donor] != clean.groups_train[i]
        assert row["input_ids"][5:] == reply and len(row["attention_mask"]) == len(row["input_ids"])
    assert np.array_equal(noisy.groups_train, clean.groups_train)  # the skill is the prompt's


@pytest.mark.parametrize("sft", [False, True])
def test_duplicates_copy_a_small_source_set_half_exactly(sft):
    clean = _task(sft=sft)
    redundant = quality_pools.corrupted(clean, duplicates=0.5)
    assert redundant.name == "toy_dup50" and len(redundant.train) == 60
    assert np.flatnonzero(redundant.corrupted).tolist() == list(range(40, 60))  # the appended copies
    originals = clean.train["input_ids"]
    assert redundant.train["input_ids"][:40] == originals
    copies = [redundant.train[i] for i in range(40, 60)]
    exact = [c for c in copies if c["input_ids"] in originals]
    assert len(exact) == 10  # every second copy is exact
    sources = set()
    for c in copies:  # a near copy differs in at most NEAR_DUPLICATE_TOKENS prompt tokens, never the reply / label
        source = min(range(40), key=lambda j: sum(a != b for a, b in zip(originals[j], c["input_ids"])))
        assert sum(a != b for a, b in zip(originals[source], c["input_ids"])) <= quality_pools.NEAR_DUPLICATE_TOKENS
        assert c["labels"] == clean.train[source]["labels"]
        sources.add(source)
    assert len(sources) <= round(quality_pools.DUPLICATE_SOURCES * 40)
    assert np.array_equal(redundant.groups_train[40:], [clean.groups_train[s] for s in
                          [min(range(40), key=lambda j, c=c: sum(a != b for a, b in zip(originals[j], c["input_ids"])))
                           for c in copies]])


def test_both_make_the_copies_first_so_some_copies_are_relabelled():
    clean = _task(sft=False)
    both = quality_pools.corrupted(clean, duplicates=0.5, label_noise=0.25)
    assert both.name == "toy_dup50_noise25" and len(both.train) == 60
    labels, inputs = np.asarray(both.train["labels"]), both.train["input_ids"]
    originals = clean.train["input_ids"]
    flipped = labels[:40] != np.asarray(clean.train["labels"])
    exact = [i for i in range(40, 60) if inputs[i] in originals]
    source = {i: originals.index(inputs[i]) for i in exact}
    relabelled = [i for i in exact if labels[i] != labels[source[i]]]
    assert int(flipped.sum()) + sum(labels[i] != clean.train["labels"][source[i]] for i in exact) <= 15
    assert relabelled  # the same text with two labels: what the near-duplicate check must not merge
    assert both.corrupted[40:].all() and np.array_equal(both.corrupted[:40], flipped)
    assert np.array_equal(both.groups_train, labels)  # a classification pool's groups follow the (new) labels


def _result(cells):
    return {"task": "toy", "metric": "accuracy", "higher_is_better": True, "n_train": 10, "recipe": {},
            "cells": cells}


def test_gain_at_equal_seconds_interpolates_each_seeds_random_curve():
    cells = []
    for seed, shift in ((0, 0.0), (1, 0.1)):
        cells += [dict(arm="random", fraction=0.1, seed=seed, seconds=10.0, steps=5, accuracy=0.2 + shift),
                  dict(arm="random", fraction=0.5, seed=seed, seconds=30.0, steps=25, accuracy=0.6 + shift),
                  dict(arm="full", fraction=1.0, seed=seed, seconds=50.0, steps=50, accuracy=0.7 + shift)]
    cells += [dict(arm="default", fraction=0.3, seed=0, seconds=20.0, steps=16, accuracy=0.5),   # curve: 0.4
              dict(arm="default", fraction=0.3, seed=1, seconds=60.0, steps=16, accuracy=0.7)]   # flat: full 0.8
    task = pareto.task_points(_result(cells), ["default"])
    assert [p["fraction"] for p in task["random_curve"]] == [0.1, 0.5, 1.0]
    assert task["random_curve"][1]["mean"] == pytest.approx(0.65)
    point = task["points"][0]
    assert point["gain_at_equal_seconds"] == pytest.approx((0.1 - 0.1) / 2)
    assert point["wins"] == 1 and point["n_seeds"] == 2 and point["seconds"] == 40.0
    cells[-2]["accuracy"] = 0.45
    cells[-1]["accuracy"] = 0.85
    point = pareto.task_points(_result(cells), ["default"])["points"][0]
    assert point["gain_at_equal_seconds"] == pytest.approx((0.05 + 0.05) / 2) and point["wins"] == 2
    with pytest.raises(ValueError, match="two fractions or more"):
        pareto.task_points(_result([c for c in cells if c["fraction"] != 0.5 and c["arm"] != "full"]), ["default"])


def test_pareto_never_overwrites_a_result_and_names_unknown_arms(tmp_path, capsys):
    import json

    cells = [dict(arm=a, fraction=f, seed=0, seconds=s, steps=1, accuracy=0.5)
             for a, f, s in (("random", 0.1, 1.0), ("random", 0.5, 5.0), ("default", 0.3, 9.0))]
    source = tmp_path / "q.json"
    source.write_text(json.dumps(dict(_result(cells), n_test=1, summary=[])))
    before = source.read_text()
    for argv, message in (([str(source), "--out", str(source)], "is one of the results read"),
                          ([str(source), "--arms", "nope", "--out", str(tmp_path / "p.json")],
                           "none of --arms ['nope'] is in the result")):
        with pytest.raises(SystemExit) as exit_info:
            pareto.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert source.read_text() == before and not (tmp_path / "p.json").exists()
    assert pareto.main([str(source), "--arms", "default", "--out", str(tmp_path / "p.json")]) == 0
    point = json.loads((tmp_path / "p.json").read_text())["tasks"][0]["points"][0]
    assert point["outside_curve"] is True and point["gain_at_equal_seconds"] == pytest.approx(0.0)
    assert "† the point's seconds lie outside random's curve" in (tmp_path / "p.md").read_text()


def _pool_result(task, gains, higher_is_better=True, n_pool=100):
    """A result whose `default` beats `random_same_steps` by `gains[fraction][seed]` (metric units)."""
    cells = []
    for fraction, per_seed in gains.items():
        for seed, gain in enumerate(per_seed):
            base, kept = (0.4 if higher_is_better else 2.0), round(fraction * n_pool)
            cells += [dict(arm="random_same_steps", fraction=fraction, seed=seed, accuracy=base, n_kept=kept),
                      dict(arm="default", fraction=fraction, seed=seed, n_kept=kept,
                           accuracy=base + (gain if higher_is_better else -gain))]
    return dict(_result(cells), task=task, metric="accuracy", higher_is_better=higher_is_better)


def test_rate_gain_pairs_seeds_per_pool_and_says_where_the_gain_grows():
    results = [_pool_result("toy", {0.1: [0.05, 0.10, -0.03]}),
               _pool_result("toy_noise20", {0.1: [0.10, 0.12, 0.02]}),
               _pool_result("toy_noise40", {0.1: [0.20, 0.10, 0.12]}),
               _pool_result("toy_dup60", {0.1: [0.01, 0.02, 0.03]})]
    table = rate_gain.rate_table(results, "default", "random_same_steps")
    noise = sorted((r for r in table["rows"] if r["kind"] == "noise"), key=lambda r: r["rate"])
    assert [r["rate"] for r in noise] == [0.0, 0.2, 0.4]  # the clean pool is rate 0 of every kind
    assert noise[0]["gains"] == pytest.approx({0: 5.0, 1: 10.0, 2: -3.0}) and noise[0]["wins"] == 2
    assert [r["mean"] for r in noise] == pytest.approx([4.0, 8.0, 14.0])
    trends = {t["kind"]: t["grows"] for t in table["trends"]}
    assert trends == {"noise": True, "dup": False}  # 4.0 -> 2.0 on the duplicated pool: shrinks
    loss = rate_gain.rate_table([_pool_result("t", {0.3: [0.1]}, False), _pool_result("t_dup30", {0.3: [0.2]}, False)],
                                "default", "random_same_steps")
    assert [r["mean"] for r in loss["rows"]] == pytest.approx([0.1, 0.2]) and loss["trends"][0]["grows"]
    assert "+0.200 ± 0.000 (1/1)" in rate_gain.markdown(loss)
    with pytest.raises(ValueError, match="each pool once"):
        rate_gain.rate_table(results + results[2:3], "default", "random_same_steps")
    other_recipe = dict(results[1], recipe={"num_train_epochs": 10})
    with pytest.raises(ValueError, match="one recipe expected"):
        rate_gain.rate_table([results[0], other_recipe], "default", "random_same_steps")
    with pytest.raises(ValueError, match=r"no seed of \['toy_noise20'\] holds both the arm 'default'"):
        unpaired = dict(results[1], cells=[c for c in results[1]["cells"] if c["arm"] != "default"])
        rate_gain.rate_table([results[0], unpaired], "default", "random_same_steps")
    with pytest.raises(ValueError, match="no noisy or duplicated pool"):
        rate_gain.rate_table(results[:1], "default", "random_same_steps")
    with pytest.raises(ValueError, match="one base task expected"):
        rate_gain.rate_table([results[0], _pool_result("other_noise20", {0.1: [0.1]})], "default", "random_same_steps")


def test_rate_gain_can_pair_the_pools_at_the_same_number_of_kept_rows():
    clean = _pool_result("toy", {0.1: [0.05], 0.3: [0.01]})
    dup = _pool_result("toy_dup60", {0.0625: [0.07], 0.1: [0.02]}, n_pool=160)  # 10 and 16 rows kept
    by_rows = rate_gain.rate_table([clean, dup], "default", "random_same_steps", by="n_kept")
    assert {(r["fraction"], r["rate"]): r["mean"] for r in by_rows["rows"]} == pytest.approx(
        {(10, 0.0): 5.0, (30, 0.0): 1.0, (10, 0.6): 7.0, (16, 0.6): 2.0})
    assert {t["fraction"]: t["grows"] for t in by_rows["trends"]} == {10: True, 16: None, 30: None}
    assert "| pool | kept rows |" in rate_gain.markdown(by_rows)
    by_fraction = rate_gain.rate_table([clean, dup], "default", "random_same_steps")
    assert [t["grows"] for t in by_fraction["trends"] if t["fraction"] == 0.1] == [False]  # 5.0 -> 2.0
    with pytest.raises(ValueError, match="'fraction' or 'n_kept' expected"):
        rate_gain.rate_table([clean, dup], "default", "random_same_steps", by="seed")
