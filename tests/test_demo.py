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
        full["train_seconds"] - (ours["warmup_seconds"] + ours["features_seconds"] + ours["clustering_seconds"]
                                 + ours["training_seconds"]), rel=1e-6)
    card = (tmp_path / "cluster" / "README.md").read_text()
    assert f"{kept} / {n}" in card and "Demo comparison" in card
    saved = json.loads((tmp_path / "demo_results.json").read_text())
    assert saved["arms"]["cluster"]["selected_examples"] == kept
    # warm-up examples count in full, then every kept example once: loss tokens of exactly those rows
    assert ours["examples_trained"] > kept and ours["tokens_trained"] > ours["selected_tokens"]
    assert full["tokens_trained"] > ours["tokens_trained"] - ours["selected_tokens"]
    assert not (tmp_path / "full").exists() and not (tmp_path / "random").exists()  # no empty output folders
    assert (tmp_path / "cluster" / "feature_map.png").is_file()
