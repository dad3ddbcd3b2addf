"""Selection overhead: feature-pass cost against training cost, proxies, and end-to-end time against full data.

    python benchmarks/overhead.py                       # SmolLM2-135M (MathQA) and all-MiniLM-L6-v2 (20NG), ~30 min
    python benchmarks/overhead.py --models minilm --quick

Run it on an idle machine (timings on 2 cores swing by more than 10× under load); every ratio below comes from
timings made in the same process, one after another. Per model, on the quality benchmark's task data
(`quality_tasks.py`: 220 MathQA problems / 1,000 20NG documents):

- **feature cost** (the faster of two passes): milliseconds per example of the default feature (`badge`) with the LM head applied to every
  position (`gather_loss_positions=False`, the v0.1 pass), with the head only at loss positions (now), and with
  the built-in proxies `feature_layers=k` (the first k blocks); each against the training milliseconds per example
  of a stock `Trainer` epoch on the full data (the ratio = feature seconds / training seconds per example);
- **agreement** of each proxy's selection at `data_fraction=0.3` with the full model's: overlap of the kept sets
  (|A ∩ B| / |A|; a random subset's expected overlap is 0.3) and ARI of the clusterings;
- **end to end**: wall seconds of `Trainer` on all data against `ClusterTrainer(data_fraction=0.3)` (defaults,
  with its phases), for 1 and 3 epochs of the same recipe, run side by side.

Writes `benchmarks/results/overhead.json`; the README's performance table comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
import quality_tasks  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer  # noqa: E402
from hf_cluster_select.features import FEATURES  # noqa: E402
from hf_cluster_select.features.proxy import truncated_layers  # noqa: E402
from hf_cluster_select.selection import cluster_features, select_subset  # noqa: E402

MODELS = {"smollm2": ("mathqa", (8, 4)), "minilm": ("20ng", (2,))}  # task, proxy depths (of 30 / 6 blocks)


def training_args(task, out_dir: str, epochs: float) -> TrainingArguments:
    recipe = dict(task.recipe, num_train_epochs=epochs)
    return TrainingArguments(output_dir=out_dir, seed=0, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **recipe)


def time_features(model, task, *, gather: bool, layers: int | None) -> tuple[float, np.ndarray, np.ndarray]:
    """Seconds of the default feature over the whole pool, the features `[n, d]` and loss-token counts `[n]`."""
    signal = FEATURES.get(ClusterSelectConfig().feature)
    lengths = [len(r) for r in task.train["input_ids"]]
    start = time.perf_counter()
    with truncated_layers(model, layers):
        out = signal(model, task.train, list(range(len(task.train))), task.collator, batch_size=8,
                     lengths=lengths, show_progress=False, gather_loss_positions=gather)
    return time.perf_counter() - start, out.features.numpy(), out.loss_tokens.numpy()


def selection_of(features: np.ndarray, loss_tokens: np.ndarray):
    config = ClusterSelectConfig(data_fraction=0.3)
    clusters = cluster_features(features, config, loss_tokens=loss_tokens)
    return clusters.labels, set(select_subset(clusters, config).indices.tolist())


def feature_costs(name: str, task, work: str) -> dict:
    """Training ms/example (one stock epoch on all data) and feature ms/example per variant, with agreement."""
    n = len(task.train)
    trainer = Trainer(model=task.make_model(0), args=training_args(task, os.path.join(work, "epoch"), 1),
                      train_dataset=task.train, data_collator=task.collator)
    start = time.perf_counter()
    trainer.train()
    train_ms = 1000 * (time.perf_counter() - start) / n
    model = task.make_model(0).eval()
    variants = {"all_positions_full_model": dict(gather=False, layers=None),
                "loss_positions_full_model": dict(gather=True, layers=None)}
    for k in MODELS[name][1]:
        variants[f"loss_positions_first_{k}_blocks"] = dict(gather=True, layers=k)
    rows, reference = {}, None
    for variant, kwargs in variants.items():
        seconds, features, loss_tokens = time_features(model, task, **kwargs)
        seconds = min(seconds, time_features(model, task, **kwargs)[0])  # the faster of two passes
        labels, kept = selection_of(features, loss_tokens)
        if variant == "loss_positions_full_model":
            reference = (labels, kept)
        rows[variant] = dict(feature_ms_per_example=1000 * seconds / n, labels=labels, kept=kept)
    for row in rows.values():
        labels, kept = row.pop("labels"), row.pop("kept")
        row["ratio_to_training_ms_per_example"] = row["feature_ms_per_example"] / train_ms
        row["kept_overlap_with_full_model"] = len(kept & reference[1]) / len(reference[1])
        row["cluster_ari_with_full_model"] = float(adjusted_rand_score(reference[0], labels))
    return {"n_examples": n, "training_ms_per_example": train_ms, "variants": rows}


def end_to_end(task, work: str, epochs: float) -> dict:
    """Full-data `Trainer` and `ClusterTrainer(data_fraction=0.3)`, same recipe and epochs, side by side."""
    full = Trainer(model=task.make_model(0), args=training_args(task, os.path.join(work, "full"), epochs),
                   train_dataset=task.train, data_collator=task.collator)
    start = time.perf_counter()
    full.train()
    full_seconds = time.perf_counter() - start
    ours = ClusterTrainer(model=task.make_model(0), args=training_args(task, os.path.join(work, "ours"), epochs),
                          train_dataset=task.train, data_collator=task.collator,
                          cluster_config=ClusterSelectConfig(data_fraction=0.3, selection_seed=0))
    start = time.perf_counter()
    ours.train()
    ours_seconds = time.perf_counter() - start
    report = ours.finalize_selection_report(measured_full_seconds=full_seconds)
    return {"epochs": epochs, "full_data_seconds": full_seconds, "cluster_trainer_seconds": ours_seconds,
            "time_ratio": ours_seconds / full_seconds, "fraction_saved": report.fraction_saved,
            "phases": {k: getattr(report, k) for k in ("warmup_seconds", "features_seconds", "clustering_seconds",
                                                       "training_seconds")},
            "selection_share_of_full_data_seconds": report.selection_seconds / full_seconds}


def markdown(result: dict) -> str:
    """The README's performance tables from the JSON: feature cost and agreement per variant, then end to end."""
    lines = ["| model | feature pass | ms / example | × training ms / example | kept-set overlap | cluster ARI |",
             "|---|---|---|---|---|---|"]
    for name, entry in result["models"].items():
        features = entry["features"]
        for variant, row in features["variants"].items():
            lines.append(f"| {name} ({entry['task']}, {features['n_examples']} ex.) | {variant.replace('_', ' ')} | "
                         f"{row['feature_ms_per_example']:.1f} | {row['ratio_to_training_ms_per_example']:.3f} | "
                         f"{row['kept_overlap_with_full_model']:.2f} | {row['cluster_ari_with_full_model']:.2f} |")
        lines.append(f"| {name} | (training, stock Trainer) | {features['training_ms_per_example']:.1f} | 1 | | |")
    lines += ["", "| model | epochs | full-data Trainer s | ClusterTrainer s (f = 0.3) | ratio | warm-up / features / "
              "clustering / training s |", "|---|---|---|---|---|---|"]
    for name, entry in result["models"].items():
        for row in entry["end_to_end"]:
            phases = " / ".join(f"{row['phases'][k]:.1f}" for k in ("warmup_seconds", "features_seconds",
                                                                     "clustering_seconds", "training_seconds"))
            lines.append(f"| {name} | {row['epochs']:g} | {row['full_data_seconds']:.1f} | "
                         f"{row['cluster_trainer_seconds']:.1f} | {row['time_ratio']:.2f} | {phases} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--epochs", type=float, nargs="+", default=[1, 3])
    parser.add_argument("--quick", action="store_true", help="tiny pools, 1 epoch (a smoke run; writes no JSON)")
    bench_io.add_report_option(parser)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "overhead.json"))
    args = parser.parse_args(argv)
    if bench_io.print_report(args.report, markdown):
        return 0
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = os.path.join("/tmp", f"overhead_{os.getpid()}")
    result = {"commit": os.popen("git -C " + os.path.dirname(os.path.abspath(__file__))
                                 + " rev-parse --short HEAD").read().strip(),
              "environment": {"python": platform.python_version(), "torch": torch.__version__,
                              "cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}, "models": {}}
    for name in args.models:
        task = quality_tasks.TASKS[MODELS[name][0]](args.quick)
        entry = {"task": task.name, "features": feature_costs(name, task, os.path.join(work, name))}
        entry["end_to_end"] = [end_to_end(task, os.path.join(work, name), e) for e in
                               (args.epochs[:1] if args.quick else args.epochs)]
        result["models"][name] = entry
        print(json.dumps({name: entry}, indent=1), flush=True)
    if not args.quick:
        bench_io.write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
