"""Quality at equal cost: the main metric against measured `train()` seconds, random subsets against ClusterTrainer.

    python benchmarks/pareto.py benchmarks/results/quality_20ng_pareto.json benchmarks/results/quality_ni_pareto.json \
        --out benchmarks/results/pareto.json

Reads `benchmarks/quality.py` results (nothing is trained). Per task, random subsets at every fraction they hold
(`random` arm, with `full` as f = 1.0) draw random's cost-quality curve; each ClusterTrainer arm (`--arms`, by
default `default`) and `random_same_steps` are points on it. A point's seconds are its `train()` wall seconds:
for ClusterTrainer the warm-up, the feature pass (quality.py runs it with `feature_cache=False`, a cold cache),
the selection and the training. The selection is worth its cost where its point lies above random's curve: the
`gain_at_equal_seconds` of a point is its metric minus random's curve linearly interpolated at its seconds (per
seed against that seed's curve, then mean, std and seeds won; the curve is flat beyond its ends, so a point slower
than full data is compared with full data; such points are marked † in the table and `outside_curve` in the JSON). Writes `--out` (JSON), and next to it .md (the table) and .png (one
panel per task).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
import quality_options  # noqa: E402

CURVE_ARMS = ("random", "full")


def random_curve(cells: list[dict], seed: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(seconds, metric, fraction)` of random's curve sorted by seconds: one seed's cells, or (`seed=None`) the means
    over seeds per fraction. Empty arrays when the result holds no random cell."""
    metric_cells = [c for c in cells if c["arm"] in CURVE_ARMS and (seed is None or c["seed"] == seed)]
    fractions = sorted({c["fraction"] for c in metric_cells})
    points = []
    for f in fractions:
        chosen = [c for c in metric_cells if c["fraction"] == f]
        points.append((float(np.mean([c["seconds"] for c in chosen])), float(np.mean([c["value"] for c in chosen])), f))
    points.sort()
    return tuple(np.array([p[k] for p in points]) for k in range(3))


def interpolate(seconds: float, curve: tuple[np.ndarray, ...]) -> float:
    """Random's metric at `seconds`: linear between the curve's points, flat beyond its ends."""
    xs, ys = curve[0], curve[1]
    return float(np.interp(seconds, xs, ys))


def task_points(result: dict, arms: list[str]) -> dict:
    """The curve and the points of one quality result (see the module docstring)."""
    sign = 1.0 if result["higher_is_better"] else -1.0
    cells = [dict(c, value=c[result["metric"]]) for c in result["cells"]]
    curve = random_curve(cells, None)
    if curve[0].size < 2:
        raise ValueError(f"{result['task']}: random's curve needs random cells at two fractions or more")
    rows = []
    for arm in [a for a in arms if a != "random"]:
        for fraction in sorted({c["fraction"] for c in cells if c["arm"] == arm}):
            mine = [c for c in cells if (c["arm"], c["fraction"]) == (arm, fraction)]
            gains = []
            for c in mine:
                seed_curve = random_curve(cells, c["seed"])
                if seed_curve[0].size >= 2:
                    gains.append(sign * (c["value"] - interpolate(c["seconds"], seed_curve)))
            gains = np.array(gains)
            seconds = float(np.mean([c["seconds"] for c in mine]))
            rows.append(dict(arm=arm, fraction=fraction, n_seeds=len(mine), seconds=seconds,
                             outside_curve=bool(seconds < curve[0][0] or seconds > curve[0][-1]),
                             steps=float(np.mean([c["steps"] for c in mine])),
                             mean=float(np.mean([c["value"] for c in mine])),
                             gain_at_equal_seconds=float(gains.mean()) if gains.size else None,
                             gain_std=float(gains.std(ddof=1)) if gains.size > 1 else None,
                             wins=int((gains > 0).sum()) if gains.size else None))
    return {"task": result["task"], "metric": result["metric"], "higher_is_better": result["higher_is_better"],
            "n_train": result["n_train"], "recipe": result["recipe"], "commits": result.get("commits"),
            "random_curve": [dict(fraction=float(f), seconds=float(x), mean=float(y)) for x, y, f in zip(*curve)],
            "points": rows}


def markdown(tasks: list[dict]) -> str:
    """One table: per task and point, its seconds, metric and gain over random's curve at those seconds."""
    lines = ["| task | arm | f | steps | train() seconds | metric | vs random's curve at equal seconds (seeds won) |",
             "|---|---|---|---|---|---|---|"]
    for task in tasks:
        scale, digits = (100, 1) if task["higher_is_better"] else (1, 3)
        for p in task["random_curve"]:
            lines.append(f"| {task['task']} | random | {p['fraction']:g} | — | {p['seconds']:.0f} | "
                         f"{scale * p['mean']:.{digits}f} {task['metric']} | (the curve) |")
        for r in task["points"]:
            gain = "—" if r["gain_at_equal_seconds"] is None else (
                f"{scale * r['gain_at_equal_seconds']:+.{digits}f} ± {scale * (r['gain_std'] or 0):.{digits}f} "
                f"({r['wins']}/{r['n_seeds']})")
            mark = " †" if r.get("outside_curve") else ""
            lines.append(f"| {task['task']} | {r['arm']} | {r['fraction']:g} | {r['steps']:.0f} | {r['seconds']:.0f} | "
                         f"{scale * r['mean']:.{digits}f} {task['metric']} | {gain}{mark} |")
    if any(r.get("outside_curve") for task in tasks for r in task["points"]):
        lines += ["", "† the point's seconds lie outside random's curve: compared with its nearest end (no full-data "
                  "run, or slower than it), not interpolated."]
    return "\n".join(lines)


def plot(tasks: list[dict], path: str) -> None:
    """One panel per task: random's curve (fractions labelled) and the ClusterTrainer / same-steps points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        xs = [p["seconds"] for p in task["random_curve"]]
        ys = [p["mean"] for p in task["random_curve"]]
        ax.plot(xs, ys, "o-", color="grey", label="random subsets (f = " +
                ", ".join(f"{p['fraction']:g}" for p in task["random_curve"]) + ")")
        for arm in dict.fromkeys(r["arm"] for r in task["points"]):
            rows = [r for r in task["points"] if r["arm"] == arm]
            ax.plot([r["seconds"] for r in rows], [r["mean"] for r in rows], "s" if arm != "random_same_steps"
                    else "^", ls="none", ms=7, label=arm if arm != "default" else "ClusterTrainer (default)")
            for r in rows:
                ax.annotate(f"{r['fraction']:g}", (r["seconds"], r["mean"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel("train() seconds (mean over seeds; 2 CPU cores)")
        ax.set_ylabel(task["metric"] + (" (higher is better)" if task["higher_is_better"] else " (lower is better)"))
        ax.set_title(task["task"])
        ax.legend(fontsize=7)
    bench_io.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="benchmarks/quality.py result JSON files, one per task")
    parser.add_argument("--arms", nargs="+", default=["default", "random_same_steps"],
                        help="the arms plotted as points (default: default random_same_steps)")
    parser.add_argument("--out", required=True, help="JSON path; its .md and .png are written next to it")
    args = parser.parse_args(argv)
    if os.path.splitext(args.out)[1] != ".json":
        parser.error(f"--out must be a .json path, got {args.out!r}")
    if any(os.path.abspath(args.out) == os.path.abspath(path) for path in args.results):
        parser.error(f"--out {args.out} is one of the results read: pick another path")
    if os.path.exists(args.out):
        try:
            quality_options.read_result(args.out, "--out")
            parser.error(f"--out {args.out} holds a benchmarks/quality.py result: it would be overwritten")
        except ValueError:
            pass  # an earlier pareto.py output (or nothing we know): overwritten
    if len(set(map(os.path.abspath, args.results))) != len(args.results):
        parser.error("a result file is listed twice")
    try:
        results = [quality_options.read_result(path, "results") for path in args.results]
        for result in results:
            unknown = sorted(set(args.arms) - {c["arm"] for c in result["cells"]})
            if unknown == sorted(args.arms):
                raise ValueError(f"{result['task']}: none of --arms {args.arms} is in the result (its arms: "
                                 f"{sorted({c['arm'] for c in result['cells']})})")
        tasks = [task_points(r, args.arms) for r in results]
    except ValueError as error:
        parser.error(str(error))
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"arms": args.arms, "tasks": tasks}, handle, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(tasks) + "\n")
    plot(tasks, os.path.splitext(args.out)[0] + ".png")
    print(markdown(tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
