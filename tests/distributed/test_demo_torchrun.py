"""The README's demo under `torchrun --nproc_per_node=2` (real SmolLM2 model; about 75 s on 2 cores)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import torchrun  # noqa: E402

pytest.importorskip("gguf")


@pytest.mark.slow
@pytest.mark.distributed
def test_demo_runs_on_two_processes(tmp_path):
    torchrun(["-m", "hf_cluster_select.demo", "--quick", "--skip-full", "--output-dir", str(tmp_path)], nproc=2,
             timeout=600)
    results = json.loads((tmp_path / "demo_results.json").read_text())
    ours = results["arms"]["cluster"]
    assert ours["world_size"] == 2
    kept = ours["selected_examples"]
    assert ours["steps"] == 2 + -(-kept // 8)  # 2 warm-up steps + one epoch over the kept set, 2 ranks × 4
    card = (tmp_path / "cluster" / "README.md").read_text()
    assert "2 rank(s) × 4 examples per device" in card and "world size 2" in card
    report = json.loads((tmp_path / "cluster" / "selection_report.json").read_text())
    assert report["world_size"] == 2
