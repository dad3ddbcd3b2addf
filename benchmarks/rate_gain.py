"""The selection's gain over random against the noise or duplication rate of the pool, from quality results.

    python benchmarks/rate_gain.py benchmarks/results/quality_20ng_rate_long.json \
        benchmarks/results/quality_20ng_noise20_rate_long.json ... --out benchmarks/results/rate_gain_20ng_long.json

Reads `benchmarks/quality.py` results of one base task and its corrupted pools (`quality_pools.py`: `<task>`,
`<task>_noise20`, `<task>_dup60`, ...; nothing is trained). Per pool and fraction, the paired per-seed gain of
`--arm` (default `default`) over `--against` (default `random_same_steps`: random's subset trained for as many
optimizer steps, warm-up counted), signed so that positive is better (points of accuracy x 100 for a metric where
higher is better, nats for a loss). Per corruption kind (label noise, duplicates) and fraction it then says whether
the mean gain grows with the rate, from the clean pool (rate 0) up: `grows` is true when each rate's mean gain is
above the one before (None for a single rate). The fraction `f` is a share of each corrupted pool, so with extra
duplicated rows the same `f` keeps more rows (1.6x at 60 %); `--by n_kept` pairs the pools at the same number of
kept rows instead (run the duplicated pools at `f * n_clean / n_pool`). Writes `--out` (JSON), and next to it .md
(the table) and .png (gain against rate).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
import quality_options  # noqa: E402

POOL_NAME = re.compile(r"^(?P<base>.+?)(?:_(?P<kind>noise|dup)(?P<rate>\d+))?$")
KINDS = {"noise": "label noise", "dup": "duplicates"}


def pool_of(task: str) -> tuple[str, str | None, float]:
    """`(base task, kind or None, rate 0-1)` of a quality task name: `20ng_noise40` -> `("20ng", "noise", 0.4)`."""
    match = POOL_NAME.match(task)
    kind = match.group("kind")
    return match.group("base"), kind, (int(match.group("rate")) / 100 if kind else 0.0)


def paired_gains(result: dict, arm: str, against: str, by: str = "fraction") -> dict[float, dict[int, float]]:
    """Per fraction (or, `by="n_kept"`, per number of kept rows), per seed: the signed gain of `arm` over `against`
    (scaled: x 100 when higher is better)."""
    sign, scale = (1.0, 100.0) if result["higher_is_better"] else (-1.0, 1.0)
    cells = {(c["arm"], c[by], c["seed"]): c[result["metric"]] for c in result["cells"]}
    gains: dict[float, dict[int, float]] = {}
    for (name, fraction, seed), value in sorted(cells.items()):
        if name == arm and (against, fraction, seed) in cells:
            gains.setdefault(fraction, {})[seed] = sign * scale * (value - cells[(against, fraction, seed)])
    return gains


def rate_table(results: list[dict], arm: str, against: str, by: str = "fraction") -> dict:
    """Rows per (kind, fraction, rate) and, per (kind, fraction), whether the mean gain grows with the rate; with
    `by="n_kept"` the `fraction` key of the rows and trends holds the number of kept rows."""
    if by not in ("fraction", "n_kept"):
        raise ValueError(f"by: 'fraction' or 'n_kept' expected, got {by!r}")
    bases = {pool_of(r["task"])[0] for r in results}
    if len(bases) != 1:
        raise ValueError(f"results: one base task expected, got {sorted(bases)}")
    tasks = [r["task"] for r in results]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"results: each pool once (merge two runs of a pool with quality.py --merge), got {tasks}")
    recipes = {repr(sorted(r["recipe"].items())) for r in results}
    if len(recipes) != 1:
        raise ValueError("results: one recipe expected (the same epochs, learning rate, ...), got "
                         + "; ".join(f"{r['task']}: {r['recipe']}" for r in results))
    gains = {r["task"]: paired_gains(r, arm, against, by) for r in results}
    missing = [task for task in tasks if not gains[task]]
    if missing:
        raise ValueError(f"results: no seed of {missing} holds both the arm {arm!r} and {against!r}")
    clean = [r for r in results if pool_of(r["task"])[1] is None]
    if len(clean) == len(results):
        raise ValueError("results: no noisy or duplicated pool among them (a task named <task>_noiseNN or "
                         "<task>_dupNN)")
    kinds = sorted({pool_of(task)[1] for task in tasks} - {None})
    rows = []
    for result in results:
        _, kind, rate = pool_of(result["task"])
        for fraction, per_seed in gains[result["task"]].items():
            values = np.array(list(per_seed.values()))
            for row_kind in ([kind] if kind else kinds):  # the clean pool is rate 0 of every kind
                rows.append(dict(kind=row_kind, fraction=fraction, rate=rate, task=result["task"],
                                 commits=result.get("commits"), gains=per_seed, mean=float(values.mean()),
                                 std=float(values.std(ddof=1)) if values.size > 1 else 0.0,
                                 wins=int((values > 0).sum()), n_seeds=int(values.size)))
    trends = []
    for kind, fraction in sorted({(r["kind"], r["fraction"]) for r in rows}):
        means = [r["mean"] for r in sorted(rows, key=lambda r: r["rate"])
                 if (r["kind"], r["fraction"]) == (kind, fraction)]
        trends.append(dict(kind=kind, fraction=fraction, means=means,
                           grows=bool(all(b > a for a, b in zip(means, means[1:]))) if len(means) > 1 else None))
    return dict(base_task=bases.pop(), arm=arm, against=against, by=by, has_clean_pool=bool(clean),
                metric=results[0]["metric"], higher_is_better=results[0]["higher_is_better"],
                recipe=results[0]["recipe"], rows=rows, trends=trends)


def markdown(table: dict) -> str:
    """Per kind and fraction: the mean paired gain (± std, seeds won) at each rate, and whether it grows."""
    rates = sorted({r["rate"] for r in table["rows"]})
    unit = "points" if table["higher_is_better"] else "nats"
    key = "f" if table.get("by", "fraction") == "fraction" else "kept rows"
    lines = [f"| pool | {key} | " + " | ".join(f"{100 * r:.0f} %" + (" (clean)" if r == 0 else "") for r in rates)
             + " | grows with the rate? |", "|---|---|" + "---|" * len(rates) + "---|"]
    for trend in table["trends"]:
        cells = []
        for rate in rates:
            row = next((r for r in table["rows"] if (r["kind"], r["fraction"], r["rate"]) ==
                        (trend["kind"], trend["fraction"], rate)), None)
            cells.append("—" if row is None else f"{row['mean']:+.{1 if unit == 'points' else 3}f} ± "
                         f"{row['std']:.{1 if unit == 'points' else 3}f} ({row['wins']}/{row['n_seeds']})")
        lines.append(f"| {KINDS[trend['kind']]} | {trend['fraction']:g} | " + " | ".join(cells)
                     + f" | {({True: 'yes', False: 'no'}).get(trend['grows'], '— (one rate)')} |")
    if all(t["grows"] is None for t in table["trends"]):
        lines += ["", "No two rates share a " + ("fraction" if key == "f" else "number of kept rows") + ": nothing to "
                  "compare (with `--by n_kept`, run the duplicated pools at f * n_clean / n_pool)."]
    lines += ["", f"Paired gain of `{table['arm']}` over `{table['against']}` ({unit}, positive = better; mean ± std "
              f"over seeds, seeds won), task `{table['base_task']}`."]
    return "\n".join(lines)


def plot(table: dict, path: str) -> None:
    """One line per (kind, fraction): mean gain against the rate, with the per-seed gains as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for trend in table["trends"]:
        rows = sorted((r for r in table["rows"] if (r["kind"], r["fraction"]) == (trend["kind"], trend["fraction"])),
                      key=lambda r: r["rate"])
        line, = ax.plot([100 * r["rate"] for r in rows], [r["mean"] for r in rows], "o-",
                        label=f"{KINDS[trend['kind']]}, " + (f"f = {trend['fraction']:g}" if table.get(
                            "by", "fraction") == "fraction" else f"{trend['fraction']:g} rows kept"))
        for r in rows:
            ax.plot([100 * r["rate"]] * len(r["gains"]), list(r["gains"].values()), ".", color=line.get_color(),
                    alpha=0.4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("noise or duplication rate of the pool (%)")
    ax.set_ylabel(f"gain over {table['against']} ({'points' if table['higher_is_better'] else 'nats'})")
    ax.set_title(f"{table['base_task']}: gain against the rate")
    ax.legend(fontsize=7)
    bench_io.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="benchmarks/quality.py result JSON files of one task's pools")
    parser.add_argument("--arm", default="default", help="the ClusterTrainer arm (default: default)")
    parser.add_argument("--against", default="random_same_steps", help="the baseline arm (default: random_same_steps)")
    parser.add_argument("--by", choices=("fraction", "n_kept"), default="fraction",
                        help="pair the pools at the same fraction (default) or the same number of kept rows")
    parser.add_argument("--out", required=True, help="JSON path; its .md and .png are written next to it")
    args = parser.parse_args(argv)
    if os.path.splitext(args.out)[1] != ".json":
        parser.error(f"--out must be a .json path, got {args.out!r}")
    try:
        results = [quality_options.read_result(path, "results") for path in args.results]
        table = rate_table(results, args.arm, args.against, args.by)
    except ValueError as error:
        parser.error(str(error))
    bench_io.write_json(args.out, table)
    stem = os.path.splitext(args.out)[0]
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(table) + "\n")
    plot(table, stem + ".png")
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
