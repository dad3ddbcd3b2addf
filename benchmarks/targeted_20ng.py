"""Targeted selection on 20 Newsgroups: does `ClusterTrainer(target_dataset=...)` keep the documents of the target
newsgroups, at the random subset's optimizer steps? (Issue 21; the SFT version `targeted.py` sets the conventions.)

    python benchmarks/targeted_20ng.py [--n-targets 2 --seeds 0 1 2 ...]   # → results/targeted_20ng.{json,md,png}
    python benchmarks/targeted_20ng.py --report-only | --quick             # MD+PNG from the JSON | ~1 min smoke run

Task: `quality_tasks.load_20ng(quick=False, pool=1000)` as is (1000 training documents, natural class imbalance; 800
test documents; all-MiniLM-L6-v2 + classification head; 3 epochs, LR 1e-4, batch 16), fp32, one torch thread. Per
(run seed, n_targets), `rng = default_rng([seed, n_targets, 21])` draws the target groups, then 8 pool documents of
each: the target set (`target_column="group"`), removed from that draw's pool (N = 1000 − 8·n_targets). Every arm
but `full` trains B = `selection_budget(N, f)` rows with the same recipe, so the same optimizer steps (recorded:
`trainer.state.global_step`): `random` and `upper_bound` (target groups only, rows drawn again when fewer than B)
are `targeted.stock_indices`; `balanced_random` (oracle) is stratified by the true class; ClusterTrainer arms use
`selection_warmup_steps=0` (base-model features, cached for a draw's arms in $HF_CLUSTER_SELECT_CACHE) and
`balance_tokens=True` (token-budget batches, the one-process default when they were measured), except
`top_k_unbalanced`: top_k_cosine in fixed batches, the one-process default since `balance_tokens="auto"`. `full`: all
1000 documents (target rows included), seed 0, read on every draw. Model init and trainer seed = run seed. Metrics
from each run's stored test predictions: accuracy on the target groups' test documents (main) and on the others'
(trade-off); macro-F1 over the target classes on all test documents (false positives cost precision).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                   ("HF_CLUSTER_SELECT_CACHE", "/tmp/targeted_20ng_features")):  # the cache before `targeted`'s own
    os.environ.setdefault(key, value)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_io  # noqa: E402
import probe_data  # noqa: E402
import quality_tasks  # noqa: E402
from targeted import stock_indices  # noqa: E402
from targeted_report import _sd, _signs  # noqa: E402

ARMS = ("random", "balanced_random", "untargeted", "cluster_relevance", "top_k_cosine", "top_k_cosine_cov25",
        "relevant_sample", "top_k_unbalanced", "upper_bound", "full")  # untargeted: ClusterTrainer without a target
TARGET_ARMS = {"cluster_relevance": ("cluster_relevance", 0.0), "top_k_cosine": ("top_k_cosine", 0.0),
               "relevant_sample": ("relevant_sample", 0.0), "top_k_unbalanced": ("top_k_cosine", 0.0),
               "top_k_cosine_cov25": ("top_k_cosine", 0.25)}  # arm: (target_rule, target_coverage)
PAIRS = [(a, b) for a in TARGET_ARMS for b in ("random", "balanced_random", "top_k_cosine") if a != b] + [
    ("untargeted", "random"), ("balanced_random", "random"), ("upper_bound", "random")]
METRICS = ("acc_target", "acc_other", "f1_target")
N_TARGETS, FRACTIONS, SEEDS = (2, 3), (0.05, 0.1), (0, 1, 2)
RESULTS = os.path.join(HERE, "results")


def draw(seed: int, k: int, classes: np.ndarray, n_groups: int, per_group: int) -> tuple[list[int], np.ndarray]:
    """The target groups of a (seed, n_targets) and the pool positions of their target rows (sorted)."""
    rng = np.random.default_rng([seed, k, 21])
    groups = [int(g) for g in rng.choice(n_groups, size=k, replace=False)]
    rows = [rng.choice(np.flatnonzero(classes == g), size=per_group, replace=False) for g in groups]
    return sorted(groups), np.sort(np.concatenate(rows))


def balanced_indices(classes: np.ndarray, budget: int, seed: int) -> np.ndarray:
    """B rows stratified by the true class: each class's rows in a random order, taken rank by rank (ties in random
    order): ⌊B/20⌋ per class plus one for B mod 20 random classes, a class short of rows leaving its share to others."""
    rng = np.random.default_rng([seed, 11])
    rank = np.empty(classes.size)
    for g in np.unique(classes):
        rank[rng.permutation(np.flatnonzero(classes == g))] = np.arange(np.sum(classes == g))
    return np.sort(np.lexsort((rng.random(classes.size), rank))[:budget])


def run_one(task, names: list, arm: str, fraction: float, seed: int, k: int | None, per_group: int, work: str):
    """Train one arm on one draw's pool and predict the test documents; returns the run record."""
    from transformers import Trainer, TrainingArguments

    from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
    from hf_cluster_select.selection import selection_budget

    wall, classes = time.perf_counter(), np.asarray(task.train["labels"])
    groups, target_rows = (None, np.zeros(0, int)) if arm == "full" else draw(seed, k, classes, len(names), per_group)
    keep = np.setdiff1d(np.arange(classes.size), target_rows)  # the draw's pool: the target rows left out
    pool, pool_classes = task.train.select(keep), classes[keep]
    budget = len(pool) if arm == "full" else selection_budget(len(pool), fraction)
    args = TrainingArguments(output_dir=work, seed=seed, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **task.recipe)
    model, extra, kwargs, target = task.make_model(seed), {}, None, None
    # token-budget batches (the one-process default when these arms were measured) for every ClusterTrainer arm but
    # top_k_unbalanced: fixed batches, the one-process default since balance_tokens="auto"
    kwargs = {"balance_tokens": arm != "top_k_unbalanced"}
    if arm in TARGET_ARMS:
        kwargs.update(zip(("target_rule", "target_coverage"), TARGET_ARMS[arm]), target_column="group")
        target = task.train.select(target_rows).add_column("group", [names[c] for c in classes[target_rows]])
    if arm in TARGET_ARMS or arm == "untargeted":
        trainer = ClusterTrainer(model=model, args=args, train_dataset=pool, data_collator=task.collator,
                                 target_dataset=target, cluster_config=ClusterSelectConfig(
                                     data_fraction=fraction, selection_warmup_steps=0, selection_seed=seed,
                                     strategy_kwargs=kwargs))
    else:
        indices = (balanced_indices(pool_classes, budget, seed) if arm == "balanced_random"
                   else stock_indices(arm, pool_classes, budget, seed, groups))
        trainer = Trainer(model=model, args=args, train_dataset=pool.select(indices), data_collator=task.collator)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if isinstance(trainer, ClusterTrainer):
        indices, report = np.asarray(trainer.selection.indices), trainer.selection_report
        extra = dict(n_clusters=int(report.n_clusters), selection_seconds=float(report.selection_seconds),
                     target_report={key: v for key, v in (report.target or {}).items() if key != "cluster_relevance"})
    eval_start = time.perf_counter()
    logits = Trainer(model=trainer.model, args=args, data_collator=task.collator).predict(task.test).predictions
    return dict(arm=arm, fraction=1.0 if arm == "full" else fraction, seed=seed, n_targets=k, targets=groups,
                target_rows=target_rows.tolist(), n_pool=len(pool), budget=budget, steps=int(trainer.state.global_step),
                seconds=seconds, eval_seconds=time.perf_counter() - eval_start, wall_seconds=time.perf_counter() - wall,
                n_kept=int(indices.size), n_kept_distinct=int(np.unique(indices).size),
                kept_per_class=np.bincount(pool_classes[indices], minlength=len(names)).tolist(),
                predictions=np.asarray(logits).argmax(-1).tolist(), **extra)


def run_key(arm: str, fraction: float, seed: int, k) -> str:
    return json.dumps([arm, 1.0 if arm == "full" else float(fraction), int(seed), None if arm == "full" else k])


def derive_cells(result: dict) -> list[dict]:
    """One cell per (n_targets, fraction, seed, arm): the run's predictions scored on that draw's target groups."""
    from sklearn.metrics import f1_score

    s, truth = result["settings"], np.asarray(result["test_labels"])
    runs = {run_key(r["arm"], r["fraction"], r["seed"], r["n_targets"]): r for r in result["runs"]}
    full, cells = next((r for r in result["runs"] if r["arm"] == "full"), None), []
    for k, seed in ((k, seed) for k in s["n_targets"] for seed in s["seeds"]):
        targets = draw(seed, k, np.asarray(result["train_labels"]), 20, s["target_per_group"])[0]
        mask = np.isin(truth, targets)
        for arm, f in ((a, f) for a in s["arms"] for f in ([1.0] if a == "full" else s["fractions"])):
            run = full if arm == "full" else runs.get(run_key(arm, f, seed, k))
            right = run is not None and np.asarray(run["predictions"]) == truth
            cells += [] if run is None else [dict(
                n_targets=k, targets=targets, fraction=f, seed=seed, arm=arm, steps=run["steps"], n_kept=run["n_kept"],
                seconds=round(run["seconds"], 1), kept_target_rows=int(sum(run["kept_per_class"][g] for g in targets)),
                acc_target=float(right[mask].mean()) if mask.any() else float("nan"),
                acc_other=float(right[~mask].mean()) if (~mask).any() else float("nan"),
                f1_target=float(f1_score(truth, run["predictions"], labels=targets, average="macro", zero_division=0)))]
    return cells


def summarise(result: dict) -> list[dict]:
    """Per (n_targets, fraction): mean ± sd per arm, paired per-seed differences (`PAIRS`), gap closed."""
    rows, s = [], result["settings"]
    for k, f in ((k, f) for k in s["n_targets"] for f in s["fractions"]):
        mine = [c for c in result["cells"] if c["n_targets"] == k and (c["fraction"] == f or c["arm"] == "full")]
        by = {a: {c["seed"]: c for c in mine if c["arm"] == a} for a in s["arms"]}
        arms = {a: dict(n_seeds=len(per), steps=sorted({c["steps"] for c in per.values()}), **{key: float(np.mean(
                        [c[key] for c in per.values()])) for key in (*METRICS, "kept_target_rows", "n_kept", "seconds")},
                        **{m + "_sd": _sd([c[m] for c in per.values()]) for m in METRICS})
                for a, per in by.items() if per}
        paired = {}
        for a, b in PAIRS:
            seeds = sorted(set(by.get(a, {})) & set(by.get(b, {})))
            if seeds:
                paired[f"{a}-{b}"] = dict(seeds=seeds, **{m: [by[a][x][m] - by[b][x][m] for x in seeds] for m in METRICS})
        gap, room = {}, paired.get("upper_bound-random", {}).get("acc_target", [])  # per seed, as `seeds`
        for a in (*TARGET_ARMS, "untargeted", "balanced_random"):
            seeds = paired.get("upper_bound-random", {}).get("seeds", [])
            per = [(by[a][x]["acc_target"] - by["random"][x]["acc_target"]) / r if r > 0 and x in by.get(a, {}) else None
                   for x, r in zip(seeds, room)]
            if by.get(a) and seeds:
                defined = [v for v in per if v is not None]
                gap[a] = dict(seeds=seeds, per_seed=per, mean=float(np.mean(defined)) if defined else None,
                              room_per_seed=room, room_mean=float(np.mean(room)))
        if set(arms) - {"full"}:  # a cell measured at this (n_targets, fraction)
            rows.append(dict(n_targets=k, fraction=f, arms=arms, paired=paired, gap_closed=gap))
    return rows


def markdown(result: dict) -> str:
    s, r, steps_bad, pp = result["settings"], result["recipe"], [], lambda v: ", ".join(f"{100 * x:+.1f}" for x in v)
    lines = [f"# Targeted selection on 20 Newsgroups ({'quick smoke run' if result['quick'] else 'grid'})", "",
             f"Setup: see `benchmarks/targeted_20ng.py`. Pool {result['n_pool']} documents minus {s['target_per_group']}"
             f" target documents per target group; {len(result['test_labels'])} test documents; {r['num_train_epochs']:g}"
             f" epoch(s), LR {r['learning_rate']:g}, batch {r['per_device_train_batch_size']}, fp32;"
             f" seeds {', '.join(map(str, s['seeds']))}. Accuracy (%) on the target groups' test documents (main) and the"
             " others'; macro-F1 over the target classes on all test documents. Differences in points, `arm − baseline`:"
             " **positive = first arm better**; signs per seed in seed order. Gap closed = (arm − random) / (upper_bound"
             " − random) on target accuracy (1 = as good as training on the target groups only)."]
    for row in result["summary"]:
        k, f, arms = row["n_targets"], row["fraction"], row["arms"]
        lines += ["", f"## {k} target groups, f = {f:g}", "", "| arm | seeds | target-group acc | other-group acc | "
                  "target macro-F1 | steps | kept target-group rows (of n) | train s |", "|---" * 8 + "|"]
        for arm, a in ((x, arms[x]) for x in s["arms"] if x in arms):
            bad = arm != "full" and "random" in arms and a["steps"] != arms["random"]["steps"]
            steps_bad += [f"{arm} at {k} targets, f = {f:g}"] if bad else []
            name, n = ("full (seed 0, all rows)", f"1 run, {a['n_seeds']} draws") if arm == "full" else (arm, a["n_seeds"])
            lines.append(f"| {name} | {n} | " + " | ".join(
                f"{100 * a[m]:.1f} ± {100 * a[m + '_sd']:.1f}" for m in METRICS) + f" | {'/'.join(map(str, a['steps']))}"
                f"{' ≠ random!' if bad else ''} | {a['kept_target_rows']:.1f} ({a['n_kept']:.0f}) | {a['seconds']:.0f} |")
        lines += ["", "| paired difference | target acc: mean ± sd | per seed | signs | other acc: mean (per seed) | "
                  "target F1: mean (signs) |", "|---" * 6 + "|"] if row["paired"] else []
        for key, d in row["paired"].items():
            t = d["acc_target"]
            lines.append(f"| {key.replace('-', ' − ')} | {100 * np.mean(t):+.1f} ± {100 * _sd(t):.1f} | {pp(t)} | "
                         f"{_signs(t)} | {100 * np.mean(d['acc_other']):+.1f} ({pp(d['acc_other'])}) | "
                         f"{100 * np.mean(d['f1_target']):+.1f} ({_signs(d['f1_target'])}) |")
        if row["gap_closed"]:
            room = next(iter(row["gap_closed"].values()))
            share = lambda v: "undefined (no room)" if v is None else f"{v:+.2f}"  # noqa: E731
            lines += ["", f"Room upper_bound − random on target accuracy: {100 * room['room_mean']:.1f} points (per "
                      f"seed {', '.join(f'{100 * v:.1f}' for v in room['room_per_seed'])}). Gap closed:"]
            lines += [f"- {a}: mean {share(d['mean'])} (per seed {', '.join(share(v) for v in d['per_seed'])})"
                      for a, d in row["gap_closed"].items()]
    lines += ["", f"**Unequal steps**: {'; '.join(steps_bad)}." if steps_bad else "Steps: every arm but `full` trained "
              "exactly the random arm's optimizer steps (`trainer.state.global_step`) in every cell.", "",
              f"{len(result['runs'])} training runs, {sum(r['wall_seconds'] for r in result['runs']) / 60:.1f} min in "
              f"all (selection, training, evaluation). Commit(s) {', '.join(f'`{c}`' for c in result['commits'])}."]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Target- and other-group accuracy per arm (mean ± sd over seeds), fractions on x; one column per target size."""
    from matplotlib.figure import Figure

    ks, fractions = result["settings"]["n_targets"], result["settings"]["fractions"]
    arms = [a for a in result["settings"]["arms"] if a != "full"]
    axes = (fig := Figure(figsize=(4.8 * len(ks), 6.6))).subplots(2, len(ks), squeeze=False, sharey="row")
    width = 0.6 * (min(np.diff(fractions)) if len(fractions) > 1 else 0.05)
    for (i, metric), (j, k) in ((x, y) for x in enumerate(("acc_target", "acc_other")) for y in enumerate(ks)):
        ax, rows = axes[i][j], [r for r in result["summary"] if r["n_targets"] == k]
        for n, arm in enumerate(arms):
            pts = np.array([(r["fraction"] + (n / max(1, len(arms) - 1) - 0.5) * width, 100 * r["arms"][arm][metric],
                             100 * r["arms"][arm][metric + "_sd"]) for r in rows if arm in r["arms"]]).reshape(-1, 3)
            ax.errorbar(pts[:, 0], pts[:, 1], yerr=pts[:, 2], marker="o", capsize=3, lw=1.2, label=arm)
        for full in [r["arms"]["full"][metric] for r in rows if "full" in r["arms"]][:1]:
            ax.axhline(100 * full, color="black", ls="--", lw=1, label="full (seed 0)")
        ax.set(title=f"{k} target groups: {metric.split('_')[1]}-group accuracy", xticks=fractions,
               xlabel="data_fraction", ylabel="accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def finish(result: dict, out: str) -> None:
    result["cells"] = derive_cells(result)
    result["summary"] = summarise(result)
    result["commits"] = sorted({r["commit"] for r in result["runs"] if r.get("commit")})
    bench_io.write_json(out, result)
    with open(os.path.splitext(out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(result) + "\n")
    plot(result, os.path.splitext(out)[0] + ".png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="result JSON (default results/targeted_20ng[_quick].json)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the MD and PNG from the JSON and exit")
    parser.add_argument("--quick", action="store_true", help="smoke run: load_20ng(quick=True), 2 target rows/group")
    for flag, kind, default in (("--fractions", float, FRACTIONS), ("--seeds", int, SEEDS), ("--n-targets", int, N_TARGETS)):
        parser.add_argument(flag, type=kind, nargs="+", default=list(default))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = parser.parse_args(argv)
    out = args.out or os.path.join(RESULTS, f"targeted_20ng{'_quick' if args.quick else ''}.json")
    if args.report_only:
        finish(result := json.load(open(out, encoding="utf-8")), out)
        print(markdown(result))
        return 0
    if args.quick:
        args.fractions, args.seeds, args.n_targets = [0.25], [0], [2]
    import torch

    torch.set_num_threads(1)  # the machine's other core runs another benchmark
    task, names = quality_tasks.load_20ng(quick=args.quick, pool=1000), sorted(set(probe_data._read_20ng("train")[1]))
    settings = dict(fractions=sorted(args.fractions), seeds=args.seeds, n_targets=sorted(args.n_targets),
                    arms=[a for a in ARMS if a in args.arms], threads=1, target_per_group=2 if args.quick else 8)
    result = dict(task="20ng_targeted", quick=args.quick, recipe=task.recipe, settings=settings, runs=[],
                  n_pool=len(task.train), class_names=names, train_labels=list(task.train["labels"]),
                  test_labels=list(task.test["labels"]))
    if os.path.exists(out):
        earlier = json.load(open(out, encoding="utf-8"))
        if (earlier["recipe"], earlier["settings"]["target_per_group"], earlier["train_labels"]) != (json.loads(
                json.dumps(task.recipe)), settings["target_per_group"], result["train_labels"]):
            parser.error(f"{out} holds another recipe or data; pass --out for a new file")
        result["runs"], merged = earlier["runs"], dict(earlier["settings"])  # keep every seed/fraction/arm measured
        merged.update({key: sorted(set(merged[key]) | set(settings[key])) for key in ("fractions", "seeds", "n_targets")})
        result["settings"] = dict(merged, arms=[a for a in ARMS if a in set(merged["arms"]) | set(settings["arms"])])
    commit = os.popen(f"git -C {HERE} rev-parse --short HEAD").read().strip()
    done = {run_key(r["arm"], r["fraction"], r["seed"], r["n_targets"]) for r in result["runs"]}
    plan = [(arm, f, seed, k) for k in settings["n_targets"] for seed in settings["seeds"] for f in settings["fractions"]
            for arm in settings["arms"] if arm != "full"]  # every 2-group draw before the 3-group ones; full last
    plan += [("full", 1.0, settings["seeds"][0], None)] if "full" in settings["arms"] else []
    todo = [r for r in plan if run_key(*r) not in done]
    print(f"{len(todo)} runs to do ({len(done)} already in {out})", flush=True)
    start = time.perf_counter()
    for i, (arm, fraction, seed, k) in enumerate(todo):
        record = run_one(task, names, arm, fraction, seed, k, settings["target_per_group"],
                         os.path.join("/tmp", f"targeted_20ng_{os.getpid()}", arm))
        result["runs"].append(dict(record, commit=commit))
        finish(result, out)
        brief = {key: v for key, v in record.items() if key not in ("predictions", "target_rows")}
        print(json.dumps(dict(brief, minutes=round((time.perf_counter() - start) / 60, 1), done=f"{i + 1}/{len(todo)}")),
              flush=True)
    finish(result, out)
    print(f"total {(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
