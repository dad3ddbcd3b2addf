"""`benchmarks/gpu_check.py` in its tiny version on CPU: every part runs and its numbers hold what they say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_synthetic_rows_are_sft_rows():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    rows = gpu_check.synthetic_rows(20, vocab=100, shortest=10, longest=20, seed=3)
    lengths = [len(r) for r in rows["input_ids"]]
    assert len(rows) == 20 and min(lengths) >= 10 and max(lengths) <= 20
    for ids, labels in zip(rows["input_ids"], rows["labels"]):
        prompt = int(0.6 * len(ids))
        assert labels[:prompt] == [-100] * prompt and labels[prompt:] == ids[prompt:]
        assert min(ids) >= 3 and max(ids) < 100
    assert rows["input_ids"] == gpu_check.synthetic_rows(20, 100, 10, 20, seed=3)["input_ids"]  # seeded


def test_tiny_check_on_cpu(tiny_check):
    result = tiny_check
    assert result["device"] == "cpu" and result["rows"] == 96 and result["model"] == "LlamaForCausalLM"
    precision = result["precision"]
    assert precision["cosine_tolerance"] == 0.99
    assert 0.99 <= precision["cosine_min"] <= precision["cosine_mean"] <= 1.0 + 1e-6  # bf16 autocast vs fp32
    assert precision["within_tolerance"] is True
    assert 0.0 <= precision["loss_max_relative_difference"] < 0.05
    assert 0.3 <= precision["selection_overlap"] <= 1.0
    features, training = result["features"], result["training"]
    assert features["padded_tokens"] >= training["tokens"] > 96 * 16  # padding only adds tokens
    assert features["tokens_per_second"] == pytest.approx(features["padded_tokens"] / features["seconds"])
    assert result["feature_to_training_tokens_per_second"] == pytest.approx(
        features["tokens_per_second"] / training["tokens_per_second"])
    end = result["end_to_end"]
    assert end["n_kept"] == 29  # round-half-up 0.3 × 96
    assert end["ratio_to_stock"] == pytest.approx(end["seconds"] / training["seconds"])
    assert set(end["stage_seconds"]) >= {"screen", "dedup", "pca", "fit", "quotas", "within_cluster"}
    composition = result["composition"]
    assert composition["gradient_checkpointing"] is True and composition["torch_compile"] is False  # CPU
    assert composition["steps_compared"] == 8 and composition["losses_finite"] is True  # 29 rows, batch 4
    assert composition["loss_max_relative_difference"] < 1e-5  # recomputing activations changes nothing in fp32
    assert all(part["peak_rss_mib"] > 0 for part in (precision, features, training, end, composition))
