"""Selection overhead: feature-pass cost against training cost, proxies, and end-to-end time against full data.

    python benchmarks/overhead.py                       # SmolLM2-135M (MathQA) and all-MiniLM-L6-v2 (20NG), ~30 min
    python benchmarks/overhead.py --models minilm --quick

Run it on an idle machine (timings on 2 cores swing by more than 10× under load); every ratio below comes from
timings made in the same process, one after another. Per model, on the quality benchmark's task data
(`quality_tasks.py`: 220 MathQA problems / 1,000 20NG documents):

- **feature cost** (the faster of two passes, at the trainer's feature batch size = the recipe's
  `per_device_eval_batch_size`): milliseconds per example of the default feature (`feature="auto"` resolved for the
  model: `badge` for MiniLM's classification head, `hidden_mean` after 20 of 30 blocks for SmolLM2) in fp32 and
  with a bf16 forward (`feature_precision="bf16"`: `torch.autocast` on CPU), of full-depth `badge` (SmolLM2: the
  default before `feature="auto"`) and of a shallower proxy; each against the training milliseconds per example of
  a stock `Trainer` epoch on the full data (the ratio = feature seconds / training seconds per example);
- **agreement** of each variant's selection at `data_fraction=0.3` with the default fp32 feature's: overlap of the
  kept sets (|A ∩ B| / |A|; a random subset's expected overlap is 0.3), ARI of the clusterings and the smallest
  cosine between an example's two feature rows; for scale, the same for the default fp32 features selected with
  another `selection_seed`;
- **end to end**: wall seconds of `Trainer` on all data against `ClusterTrainer(data_fraction=0.3)` (defaults, and
  with `feature_precision="bf16"`; features from a cold cache, `feature_cache=False`), with their phases, for 1 and
  3 epochs of the same recipe, run side by side.

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
from hf_cluster_select.features import FEATURES, describe_feature, feature_used  # noqa: E402
from hf_cluster_select.features.proxy import truncated_layers  # noqa: E402
from hf_cluster_select.selection import cluster_features, select_subset  # noqa: E402

MODELS = {"smollm2": ("mathqa", (8,)), "minilm": ("20ng", (2,))}  # task, proxy depths (of 30 / 6 blocks)


def training_args(task, out_dir: str, epochs: float) -> TrainingArguments:
    recipe = dict(task.recipe, num_train_epochs=epochs)
    return TrainingArguments(output_dir=out_dir, seed=0, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **recipe)


def time_features(model, task, *, feature: str, layers: int | None, bf16: bool) -> tuple[float, np.ndarray,
                                                                                         np.ndarray]:
    """Seconds of `feature` after `layers` blocks over the whole pool as the trainer runs it (its batch size: the
    recipe's `per_device_eval_batch_size`), the features `[n, d]` and loss-token counts `[n]`."""
    lengths = [len(r) for r in task.train["input_ids"]]
    start = time.perf_counter()
    with truncated_layers(model, layers):
        out = FEATURES.get(feature)(model, task.train, list(range(len(task.train))), task.collator,
                                    batch_size=task.recipe["per_device_eval_batch_size"], lengths=lengths,
                                    show_progress=False, autocast=bf16)
    return time.perf_counter() - start, out.features.numpy(), out.loss_tokens.numpy()


def selection_of(features: np.ndarray, loss_tokens: np.ndarray, seed: int = 0):
    """Cluster labels and kept set of the default selection at `data_fraction=0.3` with `selection_seed=seed`."""
    config = ClusterSelectConfig(data_fraction=0.3, selection_seed=seed)
    clusters = cluster_features(features, config, loss_tokens=loss_tokens)
    return clusters.labels, set(select_subset(clusters, config).indices.tolist())


def feature_costs(name: str, task, work: str) -> dict:
    """Training ms/example (one stock epoch on all data) and feature ms/example per variant, with agreement against
    the default feature in fp32 (`feature="auto"` resolved for the model)."""
    n = len(task.train)
    trainer = Trainer(model=task.make_model(0), args=training_args(task, os.path.join(work, "epoch"), 1),
                      train_dataset=task.train, data_collator=task.collator)
    start = time.perf_counter()
    trainer.train()
    train_ms = 1000 * (time.perf_counter() - start) / n
    model = task.make_model(0).eval()
    feature, layers = feature_used(model, "auto", None)
    default = describe_feature(feature, layers)
    variants = {f"{default} (default), fp32": dict(feature=feature, layers=layers, bf16=False),
                f"{default} (default), bf16 forward": dict(feature=feature, layers=layers, bf16=True)}
    if layers is not None:
        variants["badge, all blocks, fp32 (the LM default before feature='auto')"] = dict(feature="badge", layers=None, bf16=False)
    for k in MODELS[name][1]:
        variants[f"{feature} after {k} blocks, fp32"] = dict(feature=feature, layers=k, bf16=False)
    rows, reference = {}, None
    for variant, kwargs in variants.items():
        seconds, features, loss_tokens = time_features(model, task, **kwargs)
        seconds = min(seconds, time_features(model, task, **kwargs)[0])  # the faster of two passes
        labels, kept = selection_of(features, loss_tokens)
        if reference is None:
            reference = (labels, kept, features, loss_tokens)
        cosine = (features * reference[2]).sum(1) if features.shape == reference[2].shape else None
        rows[variant] = dict(feature_ms_per_example=1000 * seconds / n, labels=labels, kept=kept,
                             cosine_with_default_min=None if cosine is None else float(cosine.min()))
    for row in rows.values():
        labels, kept = row.pop("labels"), row.pop("kept")
        row["ratio_to_training_ms_per_example"] = row["feature_ms_per_example"] / train_ms
        row["kept_overlap_with_default"] = len(kept & reference[1]) / len(reference[1])  # random: 0.3
        row["cluster_ari_with_default"] = float(adjusted_rand_score(reference[0], labels))
    seed_labels, seed_kept = selection_of(reference[2], reference[3], seed=1)  # what another seed moves
    return {"n_examples": n, "training_ms_per_example": train_ms,
            "feature_batch_size": task.recipe["per_device_eval_batch_size"], "variants": rows,
            "default_fp32_with_selection_seed_1": {
                "kept_overlap_with_default": len(seed_kept & reference[1]) / len(reference[1]),
                "cluster_ari_with_default": float(adjusted_rand_score(reference[0], seed_labels))}}


ARMS = {"default": {}, "bf16 features": {"feature_precision": "bf16"}}  # ClusterTrainer arms: strategy_kwargs


def end_to_end(task, work: str, epochs: float) -> dict:
    """Full-data `Trainer` and `ClusterTrainer(data_fraction=0.3)` per arm of `ARMS`, same recipe and epochs, side
    by side in this process."""
    full = Trainer(model=task.make_model(0), args=training_args(task, os.path.join(work, "full"), epochs),
                   train_dataset=task.train, data_collator=task.collator)
    start = time.perf_counter()
    full.train()
    full_seconds = time.perf_counter() - start
    arms = {}
    for arm, kwargs in ARMS.items():
        config = ClusterSelectConfig(data_fraction=0.3, selection_seed=0, feature_cache=False, strategy_kwargs=kwargs)
        ours = ClusterTrainer(model=task.make_model(0), train_dataset=task.train, data_collator=task.collator,
                              args=training_args(task, os.path.join(work, "ours"), epochs), cluster_config=config)
        start = time.perf_counter()
        ours.train()
        seconds = time.perf_counter() - start
        report = ours.finalize_selection_report(measured_full_seconds=full_seconds)
        arms[arm] = {"cluster_trainer_seconds": seconds, "time_ratio": seconds / full_seconds,
                     "fraction_saved": report.fraction_saved, "feature_used": report.feature_used,
                     "phases": {k: getattr(report, k) for k in ("warmup_seconds", "features_seconds",
                                                                "clustering_seconds", "training_seconds")},
                     "selection_share_of_full_data_seconds": report.selection_seconds / full_seconds}
    return {"epochs": epochs, "full_data_seconds": full_seconds, "arms": arms}


def markdown(result: dict) -> str:
    """The performance tables from the JSON: feature cost and agreement per variant, then end to end per arm."""
    lines = ["| model | feature pass (trainer's batch size) | ms / example | × training ms / example | "
             "kept-set overlap with the default | cluster ARI |", "|---|---|---|---|---|---|"]
    for name, entry in result["models"].items():
        features = entry["features"]
        for variant, row in features["variants"].items():
            lines.append(f"| {name} ({entry['task']}, {features['n_examples']} ex.) | {variant} | "
                         f"{row['feature_ms_per_example']:.1f} | {row['ratio_to_training_ms_per_example']:.3f} | "
                         f"{row['kept_overlap_with_default']:.2f} | {row['cluster_ari_with_default']:.2f} |")
        other = features["default_fp32_with_selection_seed_1"]
        lines.append(f"| {name} | (default, fp32, selection_seed=1 instead of 0) | | | "
                     f"{other['kept_overlap_with_default']:.2f} | {other['cluster_ari_with_default']:.2f} |")
        lines.append(f"| {name} | (training, stock Trainer) | {features['training_ms_per_example']:.1f} | 1 | | |")
    lines += ["", "| model | epochs | full-data Trainer s | ClusterTrainer (f = 0.3) | s | ratio | warm-up / features / "
              "clustering / training s |", "|---|---|---|---|---|---|---|"]
    for name, entry in result["models"].items():
        for row in entry["end_to_end"]:
            for arm, cell in row["arms"].items():
                phases = " / ".join(f"{cell['phases'][k]:.1f}" for k in ("warmup_seconds", "features_seconds",
                                                                          "clustering_seconds", "training_seconds"))
                lines.append(f"| {name} | {row['epochs']:g} | {row['full_data_seconds']:.1f} | {arm} | "
                             f"{cell['cluster_trainer_seconds']:.1f} | {cell['time_ratio']:.2f} | {phases} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--epochs", type=float, nargs="+", default=[1, 3])
    parser.add_argument("--quick", action="store_true",
                        help="tiny pools, 1 epoch (a smoke run; writes JSON only to an explicit --out)")
    bench_io.add_report_option(parser)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/overhead.json)")
    args = parser.parse_args(argv)
    if bench_io.print_report(args.report, markdown):
        return 0
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = os.path.join("/tmp", f"overhead_{os.getpid()}")
    result = {"commit": os.popen("git -C " + os.path.dirname(os.path.abspath(__file__))
                                 + " rev-parse --short HEAD").read().strip(),
              "environment": {"python": platform.python_version(), "torch": torch.__version__,
                              "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                              "cpu": platform.processor() or platform.machine(),
                              "cpu_avx512_bf16": bool(getattr(torch.cpu, "_is_avx512_bf16_supported", bool)())},
              "models": {}}
    for name in args.models:
        task = quality_tasks.TASKS[MODELS[name][0]](args.quick)
        entry = {"task": task.name, "features": feature_costs(name, task, os.path.join(work, name))}
        entry["end_to_end"] = [end_to_end(task, os.path.join(work, name), e) for e in
                               (args.epochs[:1] if args.quick else args.epochs)]
        result["models"][name] = entry
        print(json.dumps({name: entry}, indent=1), flush=True)
    if args.out or not args.quick:
        bench_io.write_json(args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                     "overhead.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
