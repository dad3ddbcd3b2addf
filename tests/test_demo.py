"""The README's main job, as a smoke run on the real SmolLM2 model and MathQA data (`--quick`)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("gguf")


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path):
    from hf_cluster_select.demo.__main__ import main

    results = main(["--quick", "--output-dir", str(tmp_path)])
    full, rand, ours = results["arms"]["full"], results["arms"]["random"], results["arms"]["cluster"]
    n = results["n_train"]
    assert full["steps"] == math.ceil(n / 4)  # batch 4, 1 epoch, 1 process
    kept = math.floor(0.3 * n + 0.5)
    assert ours["selected_examples"] == kept
    assert ours["steps"] == 2 + math.ceil(kept / 4)  # 2 warm-up steps + one epoch over the kept set
    assert rand["selected_examples"] == kept and rand["steps"] == math.ceil(kept / 4)
    for arm in (full, rand, ours):
        # accuracy scores all 16 quick held-out problems; the loss only those that fit 128 tokens (n_eval)
        assert math.isfinite(arm["eval_loss"]) and 0.0 <= arm["accuracy"] <= 1.0 and arm["n"] == 16
        assert 1 <= results["n_eval"] <= 16
    assert ours["full_data_seconds_basis"] == "measured"
    assert ours["seconds_saved"] == pytest.approx(
        full["train_seconds"] - (ours["warmup_seconds"] + ours["features_seconds"] + ours["near_duplicates_seconds"]
                                 + ours["clustering_seconds"] + ours["training_seconds"]), rel=1e-6)
    card = (tmp_path / "cluster" / "README.md").read_text()
    assert f"{kept} / {n}" in card and "Demo comparison" in card
    saved = json.loads((tmp_path / "demo_results.json").read_text())
    assert saved["arms"]["cluster"]["selected_examples"] == kept
    # warm-up examples count in full, then every kept example once: loss tokens of exactly those rows
    assert ours["examples_trained"] > kept and ours["tokens_trained"] > ours["selected_tokens"]
    assert full["tokens_trained"] > ours["tokens_trained"] - ours["selected_tokens"]
    assert not (tmp_path / "full").exists() and not (tmp_path / "random").exists()  # no empty output folders
    assert (tmp_path / "cluster" / "feature_map.png").is_file()


def test_demo_table_says_when_features_came_from_the_cache():
    """A cache hit makes `features s` about 0 and the seconds saved larger: the table names it."""
    from hf_cluster_select.demo.__main__ import format_table

    arm = dict(eval_loss=0.5, accuracy=0.25, n=100, steps=12, examples_trained=92, tokens_trained=352,
               selected_examples=92, selected_tokens=352, train_seconds=80.0)
    ours = dict(arm, steps=16, warmup_seconds=20.0, features_seconds=0.04, clustering_seconds=1.0,
                training_seconds=70.0, seconds_saved=100.0, fraction_saved=0.5, full_data_seconds_basis="measured",
                n_clusters=23, world_size=1)
    results = {"n_eval": 94, "arms": {"full": dict(arm, train_seconds=200.0), "random": arm,
                                      "cluster": dict(ours, features_from_cache=True)}}
    cached = format_table(results)
    assert "features s (from cache)" in cached and "seconds saved: 100.0 (50.0%)" in cached
    results["arms"]["cluster"]["features_from_cache"] = False
    computed = format_table(results)
    assert "from cache" not in computed and "features s" in computed
