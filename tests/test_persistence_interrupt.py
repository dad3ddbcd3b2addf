"""Reliability (issue 5) with real processes (`tests/interrupt_worker.py` run by this interpreter):

- a run killed (SIGKILL / SIGTERM) during feature extraction, clustering, post-selection training, or while its
  selection is being saved into a checkpoint leaves complete checkpoints and no half-written artefact, and
  `train(resume_from_checkpoint=True)` finishes it exactly as an uninterrupted run (same selection, same batches,
  same weights);
- the whole pipeline (training, evaluation, model card, metrics) runs with `HF_HUB_OFFLINE=1` and every network
  connection refused, within a bounded time;
- with a broken `hdbscan` first on `sys.path`, `import hf_cluster_select` works, the default run stops before any
  model work with the fix, and the kmeans fallback trains.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import interrupt_worker as worker
from hf_cluster_select.reporting.outputs import PLOT_FILENAME, REPORT_FILENAME
from hf_cluster_select.persistence import SELECTION_FILENAME, checkpoint_problems, load_selection

WORKER = Path(worker.__file__)
ROOT = WORKER.parent.parent
FINAL_ARTEFACTS = (REPORT_FILENAME, "README.md", PLOT_FILENAME, SELECTION_FILENAME)
WARMUP_STEPS, TOTAL_STEPS = 3, 27
PAUSE_SECONDS = 180  # reaching the pause point takes ~10 s on 2 busy cores


def worker_env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra.pop("PYTHONPATH", ""), str(ROOT)) if p)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, in this process (deterministic: the worker seeds everything)."""
    trainer = worker.build_trainer(str(tmp_path_factory.mktemp("reference") / "out"))
    trainer.train()
    return {
        "seen": trainer.seen,
        "indices": trainer.selection.indices.copy(),
        "weights": trainer.selection.weights.copy(),
        "params": {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
    }


def kill_at(tmp_path: Path, phase: str, sig: int) -> Path:
    """Start the worker, wait until it pauses at `phase`, send `sig`; returns its output folder."""
    out, marker, log = tmp_path / "out", tmp_path / "paused", tmp_path / "worker.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(out), "--pause-at", phase, "--marker", str(marker)],
            env=worker_env(), stdout=subprocess.DEVNULL, stderr=stderr,
        )
    try:
        deadline = time.monotonic() + PAUSE_SECONDS
        while not marker.exists():
            assert proc.poll() is None, f"worker exited ({proc.returncode}) before {phase}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"worker did not reach {phase}:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == -sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def checkpoints(out: Path) -> dict[int, Path]:
    return {int(p.name.split("-")[1]): p for p in out.glob("checkpoint-*")}


def assert_left_behind(out: Path, steps: list[int], with_selection: list[int], reference) -> None:
    """Exactly these checkpoints, each complete; a selection file wherever one is expected, equal to the
    reference's; no final artefact (the run never ended)."""
    found = checkpoints(out)
    assert sorted(found) == steps
    for step, folder in found.items():
        assert checkpoint_problems(str(folder), WARMUP_STEPS) == []
        saved = load_selection(str(folder))
        assert (saved is not None) == (step in with_selection)
        if saved is not None:
            assert np.array_equal(saved.selection.indices, reference["indices"])
            assert np.array_equal(saved.selection.weights, reference["weights"])
    for name in FINAL_ARTEFACTS:
        assert not (out / name).exists()


def resume_and_compare(out: Path, reference, resumed_step: int) -> None:
    trainer = worker.build_trainer(str(out))
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == TOTAL_STEPS
    assert np.array_equal(trainer.selection.indices, reference["indices"])
    assert [b for s, b in trainer.seen] == [b for s, b in reference["seen"] if s >= resumed_step]
    for name, param in trainer.model.named_parameters():
        assert torch.allclose(param, reference["params"][name], atol=1e-6), name
    for name in FINAL_ARTEFACTS:
        assert (out / name).is_file()
    report = json.loads((out / REPORT_FILENAME).read_text())
    assert report["kept_indices"] == reference["indices"].tolist()
    assert not list(out.rglob("*.tmp"))  # temporary files of the killed run were cleaned up when rewritten


def test_killed_during_feature_extraction(tmp_path, reference):
    out = kill_at(tmp_path, "features", signal.SIGKILL)
    assert_left_behind(out, steps=[2], with_selection=[], reference=reference)
    resume_and_compare(out, reference, resumed_step=2)


def test_terminated_during_clustering(tmp_path, reference):
    out = kill_at(tmp_path, "clustering", signal.SIGTERM)
    assert_left_behind(out, steps=[2], with_selection=[], reference=reference)
    resume_and_compare(out, reference, resumed_step=2)


def test_killed_during_training(tmp_path, reference):
    out = kill_at(tmp_path, "training", signal.SIGKILL)  # after step 11
    assert_left_behind(out, steps=[2, 4, 6, 8, 10], with_selection=[4, 6, 8, 10], reference=reference)
    resume_and_compare(out, reference, resumed_step=10)


def test_killed_while_saving_the_selection(tmp_path, reference):
    out = kill_at(tmp_path, "selection_save", signal.SIGKILL)  # checkpoint-6: trainer files written, ours not
    incomplete = out / "checkpoint-6"
    assert (incomplete / "trainer_state.json").is_file() and not (incomplete / SELECTION_FILENAME).exists()
    assert len(list(incomplete.glob(".cluster_selection.npz.*.tmp"))) == 1  # the write never reached its rename
    assert checkpoint_problems(str(incomplete), WARMUP_STEPS) == [
        "no cluster_selection.npz although it was saved after selection (step 6 > warmup_steps 3)"]
    with pytest.raises(ValueError, match=r"is incomplete .* \(complete: \['checkpoint-2', 'checkpoint-4'\]\)"):
        worker.build_trainer(str(out)).train(resume_from_checkpoint=str(incomplete))
    resume_and_compare(out, reference, resumed_step=4)  # True skips checkpoint-6
    assert load_selection(str(incomplete)) is not None


def test_offline_pipeline(tmp_path):
    env = worker_env(HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_DISABLE_TELEMETRY", None)  # offline mode alone must keep everything local
    completed = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "out"), "--offline"], env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["attempts"] == []  # not one connection or DNS lookup was tried
    assert result["global_step"] == TOTAL_STEPS and math.isfinite(result["eval_loss"])
    assert result["perplexity"] == pytest.approx(math.exp(result["eval_loss"]))
    assert result["card_has_section"] and result["logged_selection"]
    assert set(FINAL_ARTEFACTS) | {"model.safetensors", "config.json"} <= set(result["files"])


def test_broken_hdbscan(tmp_path):
    broken = tmp_path / "site" / "hdbscan"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        'raise ValueError("numpy.dtype size changed, may indicate binary incompatibility. Expected 96 from C '
        'header, got 88 from PyObject")\n'
    )
    completed = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "out"), "--broken-hdbscan"],
                               env=worker_env(PYTHONPATH=str(tmp_path / "site")), capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["package"]  # `import hf_cluster_select` worked
    assert result["error"] == (
        "hf_cluster_select needs the `hdbscan` package for cluster_method='hdbscan' but could not import it "
        "(ValueError: numpy.dtype size changed, may indicate binary incompatibility. Expected 96 from C header, "
        "got 88 from PyObject). Fix: `pip install hdbscan` (wheels exist for CPython 3.10-3.12 on Linux/macOS). If "
        "it is installed and the error mentions binary incompatibility or `numpy.dtype size changed`, reinstall it "
        "against your numpy: `pip install --force-reinstall --no-cache-dir hdbscan`. Or avoid it with "
        "ClusterSelectConfig(cluster_method='kmeans')."
    )
    assert result["unchanged"] and result["global_step_after_error"] == 0  # failed before any model work
    assert result["kmeans_global_step"] == 6 and result["kmeans_n_kept"] == 48
