"""Targeted selection on the linear-probe tier: which `target_rule` / `target_coverage` should be the default?

Setting (issue 21): the user shows a few examples of what the model will be evaluated on; selection keeps the pool
examples that teach those target groups. Tasks from `probe_data.py` (frozen all-MiniLM-L6-v2 embeddings): `20ng`
with targets of 1, 2, 3 newsgroups and `ni` with targets of 1, 2, 4 skills. Per (task, n_targets, seed) the target
groups are drawn with `default_rng([seed, n_targets, crc32(task)])` (uniformly, without replacement), then 8 TRAIN
rows of each target group (same rng); these target examples are removed from the pool (neither trained on nor tested).
Every target group is one target task (`target_column` = the group), as `TargetSettings` intends.

Features (`probe_features.py`): a 60-step SGD warm-up of the probe on the pool, then BADGE's last-layer gradient
(p − onehot(y)) ⊗ x (projected to 256 dims) of pool and target rows under that model — the package's default
feature for a classification head. Clusters: `cluster_features(badge, ClusterSelectConfig(data_fraction=f,
selection_seed=seed))` (package default: fine KMeans). Relevance (`relevance_scores`, max cosine per task) in two
spaces: `badge` (the product's: target features from the same model as the pool's) and `emb` (the raw embeddings,
RDS+; note that the probe's `target` feature (p_y − 1)·x has the direction of −x, so its cosines are these).

Arms (every arm keeps exactly `selection_budget(n, f)` pool rows, except `upper_bound` when the target groups hold
fewer rows, and `full`): `random`; `balanced_random` (oracle: budget split over the true groups in proportion to
size, random within); `untargeted` (`select_subset`, package defaults); `<space>/cr0|cr10|cr25` (`cluster_relevance`
at target_coverage 0, 0.1, 0.25); `<space>/topk|topk10|topk25|topk50` (`top_k_cosine` at coverage 0, 0.1, 0.25,
0.5); `<space>/cr25/nw`, `<space>/topk25/nw` (the same subsets trained with uniform weights instead of
`loss_weights()`); `<space>/cmax` (a local rule, `bench_cluster_max`: clusters by their best member's relevance);
`upper_bound` (random rows of the target groups only: all of them when they are fewer than the budget, so n_kept can
be smaller, e.g. one 20ng group at f = 0.3); `full` (the whole pool, same recipe).
Training: the probe's one recipe, `probe_features.fit_probe` (multinomial logistic regression, L-BFGS run to
convergence, at most 300 iterations, tol 1e-4, C = 3, per-example weights = `Selection.loss_weights()` rescaled to
mean 1; uniform for the baselines). L-BFGS has no step budget to equalise: every arm is trained to convergence on a
set of the same size, so the subset is the only difference (iterations used are recorded as `n_iter`).
Metrics on the test set: `acc_target` (accuracy on the rows of the target groups, the main metric), `acc_other`
(the other rows: the trade-off), `f1_target` (macro-F1 of the target classes over all test rows: unlike
`acc_target` it charges the false positives of a probe biased toward the target classes) and `auc_target` (mean
one-vs-rest ROC AUC of the target classes' probabilities over all test rows: free of the class prior; 0.5 for a class
the probe never saw). Caveat: a group is a class here, so `acc_target` largely measures how far the probe's prior
moves to the target classes (a one-class probe scores 100), and a probe trained from scratch has no pretrained
knowledge to keep, so `acc_other` overstates what an LM would lose.

    OMP_NUM_THREADS=1 python benchmarks/targeted_probe.py            # writes benchmarks/results/targeted_probe.{json,md}
    OMP_NUM_THREADS=1 python benchmarks/targeted_probe.py --quick    # seconds: ni, 2 targets, f=0.1, 1 seed
                                                                     # (writes targeted_probe_quick.{json,md})
Default 10 seeds (0-9), fractions 0.05, 0.1, 0.3: about 4-5 minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_data  # noqa: E402
import probe_features as pf  # noqa: E402
from hf_cluster_select.config import ClusterSelectConfig  # noqa: E402
from hf_cluster_select.registry import TARGET_RULES  # noqa: E402
from hf_cluster_select.selection import (cluster_features, relevance_scores, select_subset,  # noqa: E402
                                         select_targeted, selection_budget)
from hf_cluster_select.settings import TargetSettings  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TARGETS = {"20ng": (1, 2, 3), "ni": (1, 2, 4)}
PER_GROUP = 8
VARIANTS = {"cr0": ("cluster_relevance", 0.0), "cr10": ("cluster_relevance", 0.1),
            "cr25": ("cluster_relevance", 0.25), "topk": ("top_k_cosine", 0.0), "topk10": ("top_k_cosine", 0.1),
            "topk25": ("top_k_cosine", 0.25), "topk50": ("top_k_cosine", 0.5)}
UNWEIGHTED = ("cr25", "topk25")
SPACES = ("badge", "emb")


@TARGET_RULES.register("bench_cluster_max")
def cluster_max(scores, labels, rng, **_):
    """Local candidate: clusters by the relevance of their best member (not the mean), members by relevance."""
    _, position = np.unique(labels, return_inverse=True)
    best = np.full(position.max() + 1, -np.inf)
    np.maximum.at(best, position, scores)
    return np.lexsort((np.arange(scores.size), -scores, -best[position]))


LOCAL_RULES = {"cmax": ("bench_cluster_max", 0.0)}


def arms() -> list[str]:
    targeted = [f"{s}/{v}" for s in SPACES for v in [*VARIANTS, *LOCAL_RULES, *(f"{u}/nw" for u in UNWEIGHTED)]]
    return ["random", "balanced_random", "untargeted", *targeted, "upper_bound", "full"]


def draw_target(task: probe_data.Task, n_targets: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(target groups [n_targets], train rows of the target examples [n_targets · PER_GROUP])."""
    rng = np.random.default_rng([seed, n_targets, zlib.crc32(task.name.encode())])
    groups = np.sort(rng.choice(task.n_classes, size=n_targets, replace=False))
    rows = [rng.choice(np.flatnonzero(task.y_train == g), size=PER_GROUP, replace=False) for g in groups]
    return groups, np.concatenate(rows)


def fit_eval(x, y, w, k, task, groups, tmask) -> dict:
    """Train the probe recipe on (x, y, w); metrics on the test set."""
    if np.unique(y).size == 1:  # L-BFGS needs two classes; a one-class probe predicts that class
        pred, n_iter = np.full(task.y_test.size, y[0]), 0
    else:
        model = pf.fit_probe(x, y, w, k)
        pred, n_iter = model.predict(task.x_test), int(np.max(model.n_iter_))
        proba = dict(zip(model.classes_.tolist(), model.predict_proba(task.x_test).T))
    hit = pred == task.y_test
    auc = [roc_auc_score(task.y_test == g, proba[g]) if n_iter and g in proba else 0.5 for g in groups]
    return {"acc_target": float(hit[tmask].mean()), "acc_other": float(hit[~tmask].mean()),
            "f1_target": float(f1_score(task.y_test, pred, labels=groups, average="macro", zero_division=0)),
            "auc_target": float(np.mean(auc)), "n_iter": n_iter}


def run_setting(task: probe_data.Task, n_targets: int, seed: int, fractions: list[float]) -> list[dict]:
    groups, target_rows = draw_target(task, n_targets, seed)
    pool = np.setdiff1d(np.arange(task.y_train.size), target_rows)
    xp, yp, xt, yt = task.x_train[pool], task.y_train[pool], task.x_train[target_rows], task.y_train[target_rows]
    k, n = task.n_classes, pool.size
    tasks = np.searchsorted(groups, yt)
    warm = pf.warmup(xp, yp, k, seed)
    badge = pf.features(xp, yp, warm, seed)["badge"]
    rel = {"badge": relevance_scores(badge, pf.features(xt, yt, warm, seed)["badge"], tasks),
           "emb": relevance_scores(xp, xt, tasks)}
    tmask = np.isin(task.y_test, groups)
    in_target = np.flatnonzero(np.isin(yp, groups))
    base = {"task": task.name, "n_target_groups": n_targets, "target_groups": groups.tolist(), "seed": seed}

    def cell(f, arm, idx, w=None):
        row = fit_eval(xp[idx], yp[idx], w, k, task, groups, tmask)
        return {**base, "fraction": f, "arm": arm, **row, "n_kept": int(idx.size),
                "target_share": float(np.isin(yp[idx], groups).mean())}

    full = cell(None, "full", np.arange(n))
    cells = []
    for f in fractions:
        budget = selection_budget(n, f)
        rng = np.random.default_rng([seed, zlib.crc32(f"{task.name}/{n_targets}/{f}".encode())])
        config = ClusterSelectConfig(data_fraction=f, selection_seed=seed)
        result = cluster_features(badge, config)
        cells.append(cell(f, "random", np.sort(rng.choice(n, size=budget, replace=False))))
        quota = pf.quotas(np.bincount(yp, minlength=k), budget)
        cells.append(cell(f, "balanced_random", np.sort(np.concatenate(
            [rng.choice(np.flatnonzero(yp == c), size=q, replace=False) for c, q in enumerate(quota) if q]))))
        sel = select_subset(result, config)
        cells.append(cell(f, "untargeted", sel.indices, sel.loss_weights()))
        for space in SPACES:
            for name, (rule, coverage) in {**VARIANTS, **LOCAL_RULES}.items():
                sel, _ = select_targeted(result.labels, rel[space], data_fraction=f, seed=seed, groups=result.groups,
                                         settings=TargetSettings(target_rule=rule, target_coverage=coverage))
                cells.append(cell(f, f"{space}/{name}", sel.indices, sel.loss_weights()))
                if name in UNWEIGHTED:
                    cells.append(cell(f, f"{space}/{name}/nw", sel.indices))
        upper = in_target if in_target.size <= budget else np.sort(rng.choice(in_target, budget, replace=False))
        cells.append(cell(f, "upper_bound", upper))
        cells.append({**full, "fraction": f})
    return cells


# ------------------------------------------------------------------------------------------------------- report
def _series(cells, task, nt, f, arm, metric) -> np.ndarray:
    rows = sorted((c for c in cells if (c["task"], c["n_target_groups"], c["fraction"], c["arm"]) == (task, nt, f, arm)),
                  key=lambda c: c["seed"])
    return np.array([c[metric] for c in rows])


def _gap(arm, rand, upper) -> float:
    """Share of the random → upper-bound gap (of the seed means) closed by `arm`."""
    span = upper.mean() - rand.mean()
    return float((arm.mean() - rand.mean()) / span) if abs(span) > 1e-9 else float("nan")


def _diff(d: np.ndarray) -> str:
    d = 100 * d
    signs = "".join("+" if x > 1e-9 else "-" if x < -1e-9 else "0" for x in d)
    return f"{d.mean():+.1f} ({signs})"


def summary(cells, fractions) -> list[dict]:
    """Per targeted arm, (task, n_targets, fraction): gap closed, Δ vs random / topk / balanced_random."""
    out = []
    settings = sorted({(c["task"], c["n_target_groups"]) for c in cells}, key=lambda s: (s[0], s[1]))
    for task, nt in settings:
        for f in fractions:
            s = lambda arm, m="acc_target": _series(cells, task, nt, f, arm, m)  # noqa: E731
            for arm in (a for a in arms() if "/" in a):
                topk = f"{arm.split('/')[0]}/topk"
                out.append({"task": task, "n_targets": nt, "fraction": f, "arm": arm,
                            "gap": _gap(s(arm), s("random"), s("upper_bound")),
                            "d_f1": s(arm, "f1_target") - s("random", "f1_target"),
                            "d_auc": s(arm, "auc_target") - s("random", "auc_target"),
                            "d_random": s(arm) - s("random"), "d_topk": s(arm) - s(topk),
                            "d_balanced": s(arm) - s("balanced_random"),
                            "d_other": s(arm, "acc_other") - s("random", "acc_other")})
    return out


def report(results: dict) -> str:
    cells, fractions, cfg = results["cells"], results["config"]["fractions"], results["config"]
    out = [f"# Targeted selection, linear-probe tier ({len(cfg['seeds'])} seeds, {results['seconds']:.0f} s)", "",
           "Generated by `python benchmarks/targeted_probe.py` (see its docstring for the protocol). Accuracies in %;"
           " Δ = paired per-seed differences in points (signs per seed); gap = share of the random → upper_bound "
           "gap in acc_target closed (from the seed means). Caveat: a group is a class here, so acc_target rewards "
           "a probe that predicts the target classes everywhere (upper_bound with one group trains a one-class probe: "
           "acc_target 100, acc_other 0); f1_target (precision included) does not.", ""]
    summ = summary(cells, fractions)
    small = [r for r in summ if r["fraction"] <= 0.1]
    out += ["## Decision criterion (f <= 0.1, mean over every task × n_targets × fraction)", "",
            "| arm | gap closed | Δacc_t vs random | vs topk | vs balanced_random | Δacc_other vs random | "
            "Δf1_target vs random | ΔAUC_target vs random |", "|---|---|---|---|---|---|---|---|"]
    for arm in (a for a in arms() if "/" in a):
        rows = [r for r in small if r["arm"] == arm]
        m = lambda key: 100 * np.mean([r[key].mean() for r in rows])  # noqa: E731
        out.append(f"| {arm} | {np.nanmean([r['gap'] for r in rows]):.2f} | {m('d_random'):+.1f} | "
                   f"{m('d_topk'):+.1f} | {m('d_balanced'):+.1f} | {m('d_other'):+.1f} | {m('d_f1'):+.1f} | "
                   f"{m('d_auc'):+.1f} |")
    out += ["", "## Gap closed per cell (acc_target)", "",
            "| arm | " + " | ".join(f"{t} {nt}t f={f}" for t, nt, f in
                                   dict.fromkeys((r["task"], r["n_targets"], r["fraction"]) for r in summ)) + " |"]
    out.append("|---|" + "---|" * (len(out[-1].split("|")) - 3))
    for arm in (a for a in arms() if "/" in a):
        out.append(f"| {arm} | " + " | ".join(f"{r['gap']:.2f}" for r in summ if r["arm"] == arm) + " |")
    for task, nt in sorted({(c["task"], c["n_target_groups"]) for c in cells}):
        for f in fractions:
            s = lambda arm, m: 100 * _series(cells, task, nt, f, arm, m)  # noqa: E731
            out += ["", f"## {task}, {nt} target group(s), f = {f}", "",
                    "| arm | acc_target | acc_other | f1_target | AUC_target | target share | n_kept | gap | "
                    "Δ vs random | Δ vs topk | Δ vs balanced_random | Δacc_other vs random |", "|---|" + "---|" * 11]
            by = {r["arm"]: r for r in summ if (r["task"], r["n_targets"], r["fraction"]) == (task, nt, f)}
            for arm in arms():
                v = {m: s(arm, m) for m in ("acc_target", "acc_other", "f1_target", "auc_target", "target_share")}
                ms = " | ".join(f"{v[m].mean():.1f}±{v[m].std(ddof=1) if v[m].size > 1 else 0:.1f}"
                                for m in v)
                extra = " | | | | |"
                if arm in by:
                    r = by[arm]
                    extra = (f" | {r['gap']:.2f} | " + " | ".join(
                        _diff(r[key]) for key in ("d_random", "d_topk", "d_balanced", "d_other"))
                        + " |")
                out.append(f"| {arm} | {ms} | {_series(cells, task, nt, f, arm, 'n_kept').mean():.0f}{extra}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run (ni, 2 targets, f=0.1, seed 0)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", default=None, help="default benchmarks/results/targeted_probe[_quick].json")
    parser.add_argument("--report", metavar="JSON", help="only rewrite the markdown of an existing result")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report, encoding="utf-8") as handle:
            results = json.load(handle)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        args.out = args.out or os.path.join(ROOT, "benchmarks", "results",
                                            f"targeted_probe{'_quick' if args.quick else ''}.json")
        seeds = [0] if args.quick else list(range(args.seeds))
        fractions = [0.1] if args.quick else [0.05, 0.1, 0.3]
        n_targets = {"ni": (2,)} if args.quick else N_TARGETS
        start, cells = time.perf_counter(), []
        for name, counts in n_targets.items():
            task = probe_data.load_task(name, threads=1)
            for nt in counts:
                for seed in seeds:
                    cells += run_setting(task, nt, seed, fractions)
                    print(f"{name} {nt}t seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
        results = {"config": {"seeds": seeds, "fractions": fractions, "n_targets": n_targets, "per_group": PER_GROUP,
                              "arms": arms(), "probe_C": pf.PROBE_C, "probe_max_iter": pf.PROBE_MAX_ITER,
                              "warmup": [pf.WARMUP_STEPS, pf.WARMUP_BATCH, pf.WARMUP_LR], "quick": args.quick},
                   "seconds": time.perf_counter() - start, "cells": cells}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=0)
    path = os.path.splitext(args.report or args.out)[0] + ".md"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(report(results))
    print(f"wrote {path} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
