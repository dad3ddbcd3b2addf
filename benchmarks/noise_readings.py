"""What `noise_share="auto"` reads from the feature pass on each benchmark pool, and how well it ranks the bad rows.

For every task and seed, `ClusterTrainer` with the default config runs its warm-up and feature pass as in
`quality.py` (the same recipe, `--epochs` / `--learning-rate` overrides included) and stops after its first step on
the subset. Recorded per cell: a classification head's `noise_rate_estimate` or a language model's
`reply_disagreement` (fractions 0–1, `selection/noise_filter.py`), the share that ran (`noise_share_applied`), the
pool's true corrupted share, and the AUROC with which the raw and the centred k-NN agreement rank the corrupted rows
(wrong labels, swapped replies, or on a duplicated pool the added copies) below the others (None on a clean pool).
The agreement is captured by wrapping `pipeline.with_noise_filter` (instrumentation only: the wrapped function runs
unchanged).

    python benchmarks/noise_readings.py --tasks ni ni_noise20 ni_noise40 ni_dup60 --epochs 5 --learning-rate 2e-3 \
        --out A.json
    python benchmarks/noise_readings.py --tasks mathqa --out B.json   # ~1 min per cell on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from sklearn.metrics import roc_auc_score
from transformers import TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import quality  # noqa: E402
import quality_tasks  # noqa: E402
from bench_io import write_json  # noqa: E402

from hf_cluster_select import ClusterTrainer, pipeline  # noqa: E402
from hf_cluster_select.selection.noise_filter import centred_features, neighbour_agreements  # noqa: E402


class _StopAfterSelection(TrainerCallback):
    """Stops training at the end of the first step on the selected subset."""

    def __init__(self) -> None:
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer is not None and getattr(self.trainer, "selection", None) is not None:
            control.should_training_stop = True
        return control


def reading(task, seed: int, fraction: float, out_dir: str) -> dict:
    """One cell: the default's warm-up and feature pass on `task` with `seed`, stopped after its first subset step."""
    captured = {}
    original = pipeline.with_noise_filter

    def capture(result, inputs, features, settings, seed_, estimate=None):
        if inputs is not None:
            captured.update(inputs=np.asarray(inputs, np.float64), features=np.asarray(features, np.float64),
                            neighbors=settings.noise_neighbors)
        return original(result, inputs, features, settings, seed_, estimate=estimate)

    args = TrainingArguments(output_dir=out_dir, seed=seed, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **task.recipe)
    stop = _StopAfterSelection()
    trainer = ClusterTrainer(model=task.make_model(seed), args=args, train_dataset=task.train,
                             data_collator=task.collator, cluster_config=quality.arm_config("default", fraction, seed),
                             callbacks=[stop])
    stop.trainer = trainer
    pipeline.with_noise_filter = capture
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        pipeline.with_noise_filter = original
    params = trainer.selection_report.clustering_params
    corrupted = np.zeros(len(task.train), bool) if task.corrupted is None else np.asarray(task.corrupted, bool)
    cell = dict(task=task.name, seed=seed, fraction=fraction, seconds=time.perf_counter() - start,
                corrupted_share=float(corrupted.mean()),
                **{k: params.get(k) for k in ("noise_share", "noise_rate_estimate", "reply_disagreement",
                                              "noise_share_applied")})
    if captured:
        u, f = captured["inputs"], captured["features"]
        present = np.abs(u).sum(axis=1) > 0
        agreements = neighbour_agreements(u, [f, centred_features(u, f)], neighbors=captured["neighbors"], seed=seed)
        for name, agreement in zip(("raw", "centred"), agreements):
            hit = corrupted[present]
            cell[f"auroc_{name}"] = (float(roc_auc_score(hit, -agreement[present])) if 0 < hit.sum() < hit.size
                                     else None)  # lower agreement = more likely corrupted
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", required=True, choices=sorted(quality_tasks.TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--epochs", type=float, default=None, help="override the tasks' num_train_epochs")
    parser.add_argument("--learning-rate", type=float, default=None, help="override the tasks' learning rate")
    parser.add_argument("--out", required=True, help="JSON path")
    args = parser.parse_args(argv)
    cells = []
    for name in args.tasks:
        task = quality_tasks.TASKS[name](False)
        task.recipe.update({k: v for k, v in (("num_train_epochs", args.epochs), ("learning_rate",
                                                                                    args.learning_rate)) if v})
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as out_dir:
                cells.append(reading(task, seed, args.fraction, out_dir))
            print(cells[-1], flush=True)
    commit = os.popen("git -C " + os.path.dirname(os.path.abspath(__file__)) + " describe --always --dirty").read()
    write_json(args.out, {"commit": commit.strip(), "epochs": args.epochs, "learning_rate": args.learning_rate,
                          "cells": cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
