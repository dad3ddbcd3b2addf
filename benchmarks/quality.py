"""Quality at budget: does ClusterTrainer's subset beat a random subset of the same size, with the same recipe?

    python benchmarks/quality.py                                  # 20ng, fractions 0.1 0.3 0.5, seeds 0 1 2
    python benchmarks/quality.py --task ni --fractions 0.3        # SmolLM2 SFT on 16 skills (slow: ~1 h)
    python benchmarks/quality.py --quick --out /tmp/q.json        # a 1-2 minute smoke run (used by the tests)
    python benchmarks/quality.py --task mathqa --fractions 0.1 0.5 --arms random default \
        --merge benchmarks/results/quality_mathqa.json               # adds fractions to an earlier result
    python benchmarks/quality.py --pool 600 --epochs 10 --learning-rate 2e-4 --fractions 0.3 \
        --out benchmarks/results/quality_20ng_converged.json         # 20ng to convergence (full data's curve)

`--curve ARM ...` evaluates those arms after every epoch (by default `full`): the convergence check, in the JSON's
`convergence` rows and under the table (a ClusterTrainer arm with a warm-up has one more point: its warm-up epoch).

Arms, each from the same model initialisation (per seed), the same recipe and the same epochs over its own data:
- `full`: stock `Trainer` on every example (once per seed);
- `random`: stock `Trainer` on a seeded uniformly random subset of `round(f·n)` examples;
- `random_same_steps`: the same random subset trained for exactly as many optimizer steps as the first ClusterTrainer
  arm listed before it ran at that fraction and seed, its warm-up on the full data included (equal steps; the
  subset's epochs repeat);
- `selection_same_steps`: the rows the reference arm kept (listed before it, in the same run), trained by the stock
  `Trainer` unweighted for as many optimizer steps as that arm ran, with no warm-up: what the selection picked,
  apart from how ClusterTrainer trains on it (a diagnostic, not a product arm);
- `default`: `ClusterTrainer` with `ClusterSelectConfig(data_fraction=f, selection_seed=seed)`;
- `paper_selection`: CluSTER's selection (KMeans K = 2 = the paper's world size of its smallest setting, sizes
  capped at 1.5·n/K, uniform quota, peripheral members, loss weight K·|C_k|/N, select before training) on one
  process. With a uniform quota, CluSTER's per-rank weight equals the per-example weight `|C_k| / kept_k` rescaled,
  and every step of the balanced allocation holds the kept clusters in equal shares, as the one-cluster-per-rank
  allocation does; only the dealing of clusters to ranks differs (irrelevant on one process);
- `cfg:FIELD=VALUE,...`: `ClusterTrainer` with those `ClusterSelectConfig` fields changed (ablations).

On a noisy or redundant pool a cell also records `corrupted_share` (share 0-1 of the kept rows whose label/reply
was replaced or that are added copies; a random subset keeps the pool's share) and `corrupted_weight` (the same,
weighted by the loss weights).

Every cell records the task's metrics, the examples trained and the measured wall seconds of the arm's `train()`
(for a ClusterTrainer arm: warm-up, feature pass from a cold cache — `feature_cache=False` — selection and training);
the summary gives mean ± std over seeds and the paired per-seed difference against `random` (the sign is such that
a positive difference is better). The class/skill distribution of each kept set, weighted by its loss weights, is
compared with the full data by total-variation distance, next to the random subset's, with the smallest kept share
of any class relative to its proportional share. Writes `--out` (a .json path) and, next to it, the same name
with .md (the tables) and .png (the gains plot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quality_options  # noqa: E402
import quality_tasks  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer  # noqa: E402
from hf_cluster_select.selection import selection_budget  # noqa: E402

PAPER_SELECTION = dict(selection_warmup_steps=0, cluster_method="kmeans", kmeans_n_clusters=2, kmeans_size_cap=1.5, pca_dim=None,
                       quota="uniform", within_cluster="peripheral", balance_tokens=False)


STOCK_ARMS = ("full", "random", "random_same_steps", "selection_same_steps")  # stock-Trainer arms
SAME_STEPS_ARMS = ("random_same_steps", "selection_same_steps")  # steps (and rows) of the reference arm


def arm_config(arm: str, fraction: float, seed: int) -> ClusterSelectConfig | None:
    """The `ClusterSelectConfig` of a ClusterTrainer arm; `None` for the stock-Trainer arms. Features are never read
    from the feature cache (`feature_cache=False` unless an arm sets it): every arm pays its feature pass."""
    if arm in STOCK_ARMS:
        return None
    overrides: dict = {}
    if arm == "paper_selection":
        overrides = dict(PAPER_SELECTION)
    elif arm.startswith("cfg:"):
        for item in arm[4:].split(","):
            key, sep, value = item.partition("=")
            if not key or not sep or key in overrides:
                raise ValueError(f"expected cfg:FIELD=VALUE,... with each ClusterSelectConfig field or strategy setting once, got {item!r}")
            try:  # numbers, true/false/null, lists and dicts as JSON; anything else is a string
                overrides[key] = json.loads(value)
            except ValueError:
                overrides[key] = value
    elif arm != "default":
        raise ValueError(f"unknown arm {arm!r}")
    overrides.setdefault("feature_cache", False)
    return ClusterSelectConfig.from_flat(dict(data_fraction=fraction, selection_seed=seed, **overrides))


def reference_arm(arms: list[str]) -> str | None:
    """The ClusterTrainer arm whose optimizer steps `random_same_steps` (and `selection_same_steps`) match: the first
    one listed before the first of them."""
    first = min((arms.index(a) for a in SAME_STEPS_ARMS if a in arms), default=len(arms))
    before = arms[:first]
    return next((a for a in before if a not in STOCK_ARMS), None)


def group_balance(groups: np.ndarray, n_groups: int, indices: np.ndarray, weights: np.ndarray) -> dict:
    """Total-variation distance of the weighted kept class/skill distribution to the full data's, and the smallest
    kept share of any group relative to its proportional share (1.0 = proportional)."""
    full = np.bincount(groups, minlength=n_groups) / groups.size
    kept = np.bincount(groups[indices], weights=weights, minlength=n_groups)
    kept = kept / kept.sum()
    counts = np.bincount(groups[indices], minlength=n_groups) / max(1, indices.size)
    present = full > 0
    return {"tv_distance": float(0.5 * np.abs(kept - full).sum()),
            "min_share_ratio": float((counts[present] / full[present]).min())}


class EpochCurve(TrainerCallback):
    """The held-out main metric at the end of every epoch (the convergence check of `--curve` arms); the seconds
    spent evaluating are kept apart so that the arm's training time excludes them."""

    def __init__(self, task) -> None:
        self.task, self.values, self.seconds = task, [], 0.0

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        start = time.perf_counter()
        self.values.append(float(self.task.evaluate(model)[self.task.main_metric]))
        model.train()
        self.seconds += time.perf_counter() - start


def run_arm(task, arm: str, fraction: float, seed: int, out_dir: str, curve: bool = False,
            max_steps: int | None = None, rows: np.ndarray | None = None) -> dict:
    """Train one arm and evaluate it; returns the cell. `curve`: also evaluate after every epoch (`curve` in the
    cell: the main metric per epoch; `seconds` excludes that evaluation). `max_steps`: train for exactly that many
    optimizer steps (epochs repeat the subset), the `random_same_steps` arm. `rows`: the dataset rows of the
    `selection_same_steps` arm (the reference arm's kept rows)."""
    recipe = dict(task.recipe, **({} if max_steps is None else {"max_steps": int(max_steps)}))
    args = TrainingArguments(output_dir=out_dir, seed=seed, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **recipe)
    model = task.make_model(seed)
    n = len(task.train)
    config = arm_config(arm, fraction, seed)
    if config is None:
        indices = np.arange(n)
        if arm in ("random", "random_same_steps"):  # the same rows: only the step count differs
            budget = selection_budget(n, fraction)
            indices = np.sort(np.random.default_rng([seed, 7]).choice(n, size=budget, replace=False))
        elif arm == "selection_same_steps":
            if rows is None:
                raise ValueError("selection_same_steps needs `rows`: the kept rows of its reference arm in this run")
            indices = np.sort(np.asarray(rows, dtype=np.int64))
        trainer = Trainer(model=model, args=args, train_dataset=task.train.select(indices),
                          data_collator=task.collator)
        weights = np.ones(indices.size)
    else:
        trainer = ClusterTrainer(model=model, args=args, train_dataset=task.train, data_collator=task.collator,
                                 cluster_config=config)
    epoch_curve = EpochCurve(task) if curve else None
    if epoch_curve is not None:
        trainer.add_callback(epoch_curve)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start - (epoch_curve.seconds if epoch_curve is not None else 0.0)
    if config is not None:
        indices = trainer.selection.indices
        weights = trainer.selection_run.dense_loss_weights[torch.as_tensor(indices)].numpy().astype(np.float64)
    metrics = task.evaluate(trainer.model)
    cell = dict(task=task.name, arm=arm, fraction=fraction, seed=seed, seconds=seconds, n_kept=int(indices.size),
                steps=int(trainer.state.global_step), **metrics,
                **group_balance(task.groups_train, task.n_groups, np.asarray(indices), weights))
    if getattr(task, "corrupted", None) is not None:  # a noisy/redundant pool: how much of the kept set is corrupted
        hit = np.asarray(task.corrupted)[np.asarray(indices)]
        cell.update(corrupted_share=float(hit.mean()), corrupted_weight=float((weights * hit).sum() / weights.sum()))
    if config is not None:
        report = trainer.selection_report
        cell.update(n_clusters=report.n_clusters, selection_seconds=report.selection_seconds,
                    **{k: v for k, v in report.clustering_params.items()
                       if k.startswith("noise_") or k == "reply_disagreement"})
        cell["_rows"] = np.asarray(indices)  # for a selection_same_steps arm of this run; not written
    if epoch_curve is not None:
        cell["curve"] = epoch_curve.values
    return cell


def convergence(cells: list[dict], higher_is_better: bool) -> list[dict]:
    """Per arm and fraction with `curve` cells: the mean main metric after each epoch and the last epoch's change
    (positive = it still improved), mean over seeds; the issue's test of a converged recipe is that full data's
    last-epoch change is about zero or negative."""
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for arm, fraction in sorted({(c["arm"], c["fraction"]) for c in cells if c.get("curve")}):
        curves = [c["curve"] for c in cells if (c["arm"], c["fraction"]) == (arm, fraction) and c.get("curve")]
        length = min(len(v) for v in curves)
        mean = np.mean([v[:length] for v in curves], axis=0)
        last = [sign * (v[length - 1] - v[length - 2]) for v in curves] if length > 1 else [float("nan")]
        rows.append(dict(arm=arm, fraction=fraction, n_seeds=len(curves), per_epoch=[float(x) for x in mean],
                         last_epoch_gain=float(np.mean(last)), last_epoch_gains=[float(x) for x in last]))
    return rows


def summarise(cells: list[dict], main: str, higher_is_better: bool) -> list[dict]:
    """Mean ± std per (task, fraction, arm) and the paired per-seed difference against `random`."""
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    keys = sorted({(c["task"], c["fraction"], c["arm"]) for c in cells if c["arm"] != "full"})
    for task, fraction, arm in keys:
        mine = {c["seed"]: c for c in cells if (c["task"], c["fraction"], c["arm"]) == (task, fraction, arm)}
        base = {c["seed"]: c for c in cells if (c["task"], c["fraction"], c["arm"]) == (task, fraction, "random")}
        same = {c["seed"]: c for c in cells
                if (c["task"], c["fraction"], c["arm"]) == (task, fraction, "random_same_steps")}
        values = np.array([c[main] for c in mine.values()])
        paired = np.array([sign * (mine[s][main] - base[s][main]) for s in sorted(mine) if s in base])
        equal = np.array([sign * (mine[s][main] - same[s][main]) for s in sorted(mine) if s in same])
        if arm != "selection_same_steps" and (
                arm in STOCK_ARMS or not any(mine[s].get("selection_seconds") is not None for s in mine)):
            equal = np.zeros(0)  # equal steps: ClusterTrainer arms (and the selection trained stock) only
        rows.append(dict(task=task, fraction=fraction, arm=arm, metric=main, n_seeds=len(values),
                         mean=float(values.mean()), std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                         paired_gain_vs_random=float(paired.mean()) if paired.size else None,
                         paired_gain_std=float(paired.std(ddof=1)) if paired.size > 1 else None,
                         wins_vs_random=int((paired > 0).sum()) if paired.size else None,

                         tv_distance=float(np.mean([c["tv_distance"] for c in mine.values()])),
                         min_share_ratio=float(np.min([c["min_share_ratio"] for c in mine.values()])),
                         seconds=float(np.mean([c["seconds"] for c in mine.values()]))))
        if equal.size:  # only where a random_same_steps arm ran: older results keep their summary as it was
            rows[-1].update(paired_gain_vs_same_steps=float(equal.mean()), wins_vs_same_steps=int((equal > 0).sum()))
    for task in sorted({c["task"] for c in cells}):
        full = [c for c in cells if c["task"] == task and c["arm"] == "full"]
        if full:
            values = np.array([c[main] for c in full])
            rows.append(dict(task=task, fraction=1.0, arm="full", metric=main, n_seeds=len(values),
                             mean=float(values.mean()), std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                             seconds=float(np.mean([c["seconds"] for c in full]))))
    return rows


SECONDARY_METRICS = ("accuracy", "macro_f1")  # reported under the main table when the cells hold them (higher = better)


def markdown(result: dict) -> str:
    """The README tables: per arm and fraction, mean ± std of the main metric over seeds, the paired gain against
    the random subset (seeds won), the weighted class/skill TV distance and the smallest kept share; then the same
    (without TV and share) for each secondary metric the cells hold (`SECONDARY_METRICS`), and the commits."""
    cells = result.get("cells", [])
    lines = [_table(result["summary"], result["metric"], result.get("higher_is_better", True), result, True)]
    for metric in SECONDARY_METRICS:
        if metric != result["metric"] and cells and all(metric in c for c in cells):
            rows = summarise(cells, metric, True)
            lines += ["", _table(rows, metric, True, result, False)]
    for row in convergence(cells, result.get("higher_is_better", True)):
        scale = 100 if result.get("higher_is_better", True) else 1
        epochs = ", ".join(f"{scale * v:.{1 if scale == 100 else 3}f}" for v in row["per_epoch"])
        name = "full data" if row["arm"] == "full" else f"{row['arm']} (f = {row['fraction']:g})"
        lines += ["", f"{name}: {result['metric']} after each epoch, mean of {row['n_seeds']} seed(s): {epochs}; "
                  f"last epoch's gain {scale * row['last_epoch_gain']:+.{1 if scale == 100 else 3}f}"]
    commits = result.get("commits") or [result.get("commit")]
    lines += ["", f"Measured at commit{'s' if len(commits) > 1 else ''} {', '.join(f'`{c}`' for c in commits)}."]
    return "\n".join(lines)


def _table(rows: list[dict], metric: str, higher_is_better: bool, result: dict, balance: bool) -> str:
    scale = 100 if higher_is_better else 1  # accuracy in %, loss in nats
    digits = 1 if scale == 100 else 3
    fractions = sorted({r["fraction"] for r in rows if r["arm"] != "full"})
    arms = [a for a in result["arms"] if a != "full"]
    tail = " / TV / min share" if balance else ""
    head = "| arm | " + " | ".join(f"f = {f:g}: {metric} (gain vs random, wins) [vs random_same_steps]{tail}"
                                   for f in fractions)
    lines = [head + " |", "|---|" + "---|" * len(fractions)]
    for arm in arms:
        cells = []
        for f in fractions:
            r = next((x for x in rows if x["arm"] == arm and x["fraction"] == f), None)
            if r is None:
                cells.append("—")
                continue
            gain = "" if arm == "random" or r["paired_gain_vs_random"] is None else (
                f" ({scale * r['paired_gain_vs_random']:+.{digits}f}, {r['wins_vs_random']}/{r['n_seeds']})")
            if r.get("paired_gain_vs_same_steps") is not None:
                gain += (f" [same steps: {scale * r['paired_gain_vs_same_steps']:+.{digits}f}, "
                         f"{r['wins_vs_same_steps']}/{r['n_seeds']}]")
            extra = f" / {r['tv_distance']:.3f} / {r['min_share_ratio']:.2f}" if balance else ""
            cells.append(f"{scale * r['mean']:.{digits}f} ± {scale * r['std']:.{digits}f}{gain}{extra}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    full = next((x for x in rows if x["arm"] == "full"), None)
    if full:
        lines.append(f"| full data | {scale * full['mean']:.{digits}f} ± {scale * full['std']:.{digits}f} (all "
                     f"{result['n_train']}) |" + " |" * (len(fractions) - 1))
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Paired gain vs random per fraction, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm in sorted({r["arm"] for r in rows if r["task"] == task and r["arm"] not in ("full", "random")}):
            points = sorted((r["fraction"], r["paired_gain_vs_random"], r["paired_gain_std"] or 0.0)
                            for r in rows if r["task"] == task and r["arm"] == arm
                            and r["paired_gain_vs_random"] is not None)  # no random arm at that fraction: no point
            if not points:
                continue
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                        capsize=3, label=arm)
        ax.axhline(0.0, color="grey", lw=1)
        ax.set_title(f"{task}: gain vs random (paired, ± std over seeds)")
        ax.set_xlabel("data_fraction")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = quality_options.build_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    report = quality_options.check_options(parser, args, arm_config)
    if report is not None:  # --report: print its tables again, nothing else
        print(markdown(report))
        return 0
    earlier = quality_options.merged_results(parser, args)
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"quality_{args.task}.json")
    # `abc1234-dirty` when tracked files differ from that commit: the code that ran is not exactly the commit's
    commit = os.popen("git -C " + os.path.dirname(os.path.abspath(__file__)) + " describe --always --dirty").read().strip()
    if args.merge_only:  # nothing is measured at HEAD: the result keeps the last merged file's commit
        commit = earlier.get("commit") or commit
        args.arms, args.seeds = [], []
        task = argparse.Namespace(main_metric=earlier["metric"], higher_is_better=earlier["higher_is_better"],
                                  train=range(earlier["n_train"]), test=range(earlier["n_test"]),
                                  recipe=earlier["recipe"])
    else:
        loader = quality_tasks.TASKS[args.task]
        task = loader(args.quick, pool=args.pool) if args.pool else loader(args.quick)  # the code that runs
        if args.epochs is not None:
            task.recipe["num_train_epochs"] = args.epochs
        if args.learning_rate is not None:
            task.recipe["learning_rate"] = args.learning_rate
        if earlier and (json.loads(json.dumps(task.recipe)) != earlier["recipe"]
                        or len(task.train) != earlier["n_train"]):
            parser.error(f"--merge: the earlier result's recipe ({earlier['recipe']}, {earlier['n_train']} training "
                         f"examples) is not this run's ({task.recipe}, {len(task.train)}); pass the same --pool, "
                         "--epochs and --learning-rate")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # after every check: an error leaves nothing
    work = os.path.join("/tmp", f"quality_{args.task}_{os.getpid()}")
    partial = os.path.splitext(out)[0] + ".partial.json"  # the cells so far, while the run lasts
    cells = []
    for seed in args.seeds:
        for fraction in args.fractions:
            for arm in args.arms:
                if arm == "full" and fraction != args.fractions[0]:
                    continue  # one full-data run per seed
                max_steps = rows = None
                if arm in SAME_STEPS_ARMS:  # as many optimizer steps as the reference arm, warm-up included
                    reference = reference_arm(args.arms)
                    cell = next(c for c in cells + earlier.get("cells", [])
                                if (c["arm"], c["fraction"], c["seed"]) == (reference, fraction, seed))
                    max_steps, rows = cell["steps"], cell.get("_rows")
                cell = run_arm(task, arm, 1.0 if arm == "full" else fraction, seed, os.path.join(work, arm),
                               curve=arm in args.curve, max_steps=max_steps, rows=rows)
                if max_steps is not None:
                    cell["reference_arm"] = reference
                cell["commit"] = commit
                cells.append(cell)
                print(json.dumps({k: v for k, v in cell.items() if not k.startswith(("loss_skill_", "_"))}),
                      flush=True)
                with open(partial, "w", encoding="utf-8") as handle:  # survives an interruption; `out` (maybe
                    json.dump({"cells": _written(cells)}, handle, indent=1)  # a --merge file) is written at the end
    if os.path.exists(partial):
        os.remove(partial)
    cells = _written(cells)
    redone = {(c["arm"], c["fraction"], c["seed"]) for c in cells}
    cells = [c for c in earlier.get("cells", []) if (c["arm"], c["fraction"], c["seed"]) not in redone] + cells
    arms = list(dict.fromkeys(earlier.get("arms", []) + args.arms))
    rows = summarise(cells, task.main_metric, task.higher_is_better)
    result = {"task": args.task, "commit": commit, "commits": sorted({c["commit"] for c in cells}),
              "quick": args.quick, "metric": task.main_metric,
              "higher_is_better": task.higher_is_better, "n_train": len(task.train), "n_test": len(task.test),
              "recipe": task.recipe, "arms": arms, "summary": rows,
              "convergence": convergence(cells, task.higher_is_better), "cells": cells}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    plot(rows, os.path.splitext(out)[0] + ".png")
    with open(os.path.splitext(out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(result) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0


def _written(cells: list[dict]) -> list[dict]:
    """The cells without their in-memory fields (`_rows`: a ClusterTrainer arm's kept rows)."""
    return [{k: v for k, v in c.items() if not k.startswith("_")} for c in cells]


if __name__ == "__main__":
    sys.exit(main())
