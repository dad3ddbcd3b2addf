"""The report of `benchmarks/targeted.py`: cells, summary, room check, Markdown and PNG from the runs of its JSON
(the grid's run plan and training live in `targeted.py`, which imports this module; see its docstring for the task,
the arms and the metric)."""

from __future__ import annotations

import json
import os

import numpy as np

import bench_io

SHARED_ARMS = ("random", "balanced_random", "untargeted", "full")  # do not depend on the target skills
# the arms whose paired differences and gap closed the report computes
FOCAL_ARMS = ("relevant_sample", "targeted", "top_k_cosine", "top_k_unbalanced", "untargeted")
PAIRED_ROWS = ("relevant_sample-random", "relevant_sample-balanced_random", "relevant_sample-top_k_cosine",
               "relevant_sample-upper_bound", "targeted-top_k_cosine", "top_k_cosine-random",
               "top_k_cosine-balanced_random", "top_k_cosine-upper_bound", "top_k_unbalanced-top_k_cosine",
               "top_k_unbalanced-upper_bound", "untargeted-random")
N_TARGETS = (1, 2, 4)
TARGET_PER_SKILL = 8
N_SKILLS = 16


def draw_targets(seed: int, n_targets: int) -> list[int]:
    """The target skills of a run seed and target size (seeded, independent draws)."""
    rng = np.random.default_rng([seed, n_targets, 21])
    return sorted(int(s) for s in rng.choice(N_SKILLS, size=n_targets, replace=False))


def run_key(arm: str, fraction: float, seed: int, targets) -> str:
    return json.dumps([arm, 1.0 if arm == "full" else float(fraction), int(seed),
                       None if arm in SHARED_ARMS else list(targets)])


def skill_loss(losses: dict, skill: int, rows: int) -> float:
    values = losses[str(skill)][:rows]
    if len(values) < rows:
        raise ValueError(f"skill {skill} was evaluated on {len(values)} rows, {rows} needed")
    return float(np.mean(values))


def derive_cells(result: dict) -> list[dict]:
    """One cell per (n_targets, fraction, seed, arm): the run's losses split into target and other skills."""
    s = result["settings"]
    runs = {run_key(r["arm"], r["fraction"], r["seed"], r["targets"]): r for r in result["runs"]}
    full = next((r for r in result["runs"] if r["arm"] == "full"), None)
    cells = []
    for seed in s["seeds"]:
        for k in s["n_targets"]:
            targets = draw_targets(seed, k)
            for fraction in s["fractions"] + [1.0]:
                for arm in s["arms"]:
                    if (arm == "full") != (fraction == 1.0):
                        continue  # full: one cell per seed's target draw, at fraction 1
                    run = full if arm == "full" else runs.get(run_key(arm, fraction, seed, targets))
                    if run is None:
                        continue
                    others = [x for x in range(N_SKILLS) if x not in targets]
                    cells.append(dict(
                        n_target_skills=k, target_skills=targets,
                        target_names=[result["skill_names"][x] for x in targets], fraction=fraction, seed=seed,
                        arm=arm, trained_seed=run["seed"], shared_run=arm in SHARED_ARMS, steps=run["steps"],
                        seconds=round(run["seconds"], 1),
                        loss_target=float(np.mean([skill_loss(run["losses"], x, s["eval_per_skill"])
                                                   for x in targets])),
                        loss_other=float(np.mean([skill_loss(run["losses"], x, s["other_eval"]) for x in others])),
                        n_kept=run["n_kept"], n_kept_distinct=run["n_kept_distinct"],
                        kept_target_rows=int(sum(run["kept_per_skill"][x] for x in targets)),
                        commit=run.get("commit")))
    return cells


def _sd(values) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def summarise(result: dict) -> list[dict]:
    """Per (n_targets, fraction): mean ± sd per arm, the paired differences of targeted and the gap closed."""
    cells = result["cells"]
    runs = {run_key(r["arm"], r["fraction"], r["seed"], r["targets"]): r for r in result["runs"]}
    rows = []
    for k in result["settings"]["n_targets"]:
        for fraction in result["settings"]["fractions"]:
            mine = [c for c in cells if c["n_target_skills"] == k and (c["fraction"] == fraction or c["arm"] == "full")]
            by = {a: {c["seed"]: c for c in mine if c["arm"] == a} for a in result["settings"]["arms"]}
            arms = {}
            for arm, per_seed in by.items():
                if not per_seed:
                    continue
                t = [c["loss_target"] for c in per_seed.values()]
                o = [c["loss_other"] for c in per_seed.values()]
                arms[arm] = dict(n_seeds=len(t), loss_target=float(np.mean(t)), loss_target_sd=_sd(t),
                                 loss_other=float(np.mean(o)), loss_other_sd=_sd(o),
                                 steps=sorted({c["steps"] for c in per_seed.values()}),
                                 kept_target_rows=float(np.mean([c["kept_target_rows"] for c in per_seed.values()])),
                                 n_kept=float(np.mean([c["n_kept"] for c in per_seed.values()])),
                                 seconds=float(np.mean([c["seconds"] for c in per_seed.values()])))
            paired = {}
            for arm in FOCAL_ARMS:
                for base in ("random", "balanced_random", "top_k_cosine", "upper_bound"):
                    if arm == base or arm not in by or base not in by:
                        continue
                    seeds = sorted(set(by[arm]) & set(by[base]))
                    if not seeds:
                        continue
                    d = [by[arm][x]["loss_target"] - by[base][x]["loss_target"] for x in seeds]
                    d_other = [by[arm][x]["loss_other"] - by[base][x]["loss_other"] for x in seeds]
                    paired[f"{arm}-{base}"] = dict(seeds=seeds, mean=float(np.mean(d)), sd=_sd(d), per_seed=d,
                                                   other_mean=float(np.mean(d_other)), other_per_seed=d_other)
            gap = {}
            for arm in (*FOCAL_ARMS, "balanced_random"):
                if arm not in by or "random" not in by or "upper_bound" not in by:
                    continue
                seeds = sorted(set(by[arm]) & set(by["random"]) & set(by["upper_bound"]))
                per = []
                for x in seeds:
                    room = by["random"][x]["loss_target"] - by["upper_bound"][x]["loss_target"]
                    per.append((by["random"][x]["loss_target"] - by[arm][x]["loss_target"]) / room
                               if room > 0 else None)  # no room on that seed: undefined
                room = [by["random"][x]["loss_target"] - by["upper_bound"][x]["loss_target"] for x in seeds]
                defined = [v for v in per if v is not None]
                if seeds:
                    gap[arm] = dict(seeds=seeds, per_seed=per, mean=float(np.mean(defined)) if defined else None,
                                    room_per_seed=room, room_mean=float(np.mean(room)))
            same = [x for x in sorted(set(by.get("targeted", {})) & set(by.get("top_k_cosine", {})))
                    if all(by["targeted"][x][m] == by["top_k_cosine"][x][m] for m in ("loss_target", "loss_other"))]
            overlap = {}  # share of targeted's kept rows that top_k_cosine also kept (runs that stored `kept`)
            for x in sorted(set(by.get("targeted", {})) & set(by.get("top_k_cosine", {}))):
                mine_run, other_run = (runs.get(run_key(a, fraction, x, draw_targets(x, k)))
                                       for a in ("targeted", "top_k_cosine"))
                if mine_run and other_run and mine_run.get("kept") and other_run.get("kept"):
                    overlap[x] = len(set(mine_run["kept"]) & set(other_run["kept"])) / len(set(mine_run["kept"]))
            rows.append(dict(n_target_skills=k, fraction=fraction, arms=arms, paired=paired, gap_closed=gap,
                             targeted_equals_top_k_seeds=same, kept_overlap_with_top_k=overlap))
    return rows


# ---- report ---------------------------------------------------------------------------------------------------------
def _signs(values) -> str:
    return "".join("−" if v < 0 else "+" if v > 0 else "0" for v in values)


def _per_seed(values) -> str:
    return ", ".join(f"{v:+.3f}" for v in values)


def markdown(result: dict) -> str:
    s, recipe = result["settings"], result["recipe"]
    lines = [
        f"# Targeted selection on Natural-Instructions SFT ({'quick smoke run' if result.get('quick') else 'grid'})",
        "",
        f"Pool: {s['pool_per_skill']} rows × 16 skills = {result['n_pool']} rows; "
        f"held-out: {s['eval_per_skill']} rows "
        f"per skill (other skills: the first {s['other_eval']}); target: {TARGET_PER_SKILL} rows per target skill "
        "(kept out of pool and evaluation). SmolLM2-135M-Instruct, LoRA r=8 on q/v; "
        f"recipe: {recipe['num_train_epochs']:g} epoch(s), LR {recipe['learning_rate']:g} (linear, 10 % warm-up), "
        f"batch {recipe['per_device_train_batch_size']}, {s.get('precision', 'bf16 autocast (CPU)')}, "
        f"{s['threads']} thread(s). "
        "Every arm trains the same optimizer steps (ClusterTrainer arms: `selection_warmup_steps=0`, features from "
        "the base model), except `full` (all rows; trained once, seed 0, read on each seed's target draw). "
        f"Seeds {', '.join(map(str, s['seeds']))}; target skills drawn per seed "
        "(`default_rng([seed, n_targets, 21])`).",
        "",
        "Loss = mean target-token cross-entropy on held-out rows (nats, lower is better), averaged per skill then over "
        "skills. Differences are loss differences, `arm − baseline`: **negative = the first arm better**; signs per seed "
        "in seed order. Gap closed = (random − arm) / (random − upper_bound) on the target skills (1 = as good as "
        "training on the target skills only, 0 = no better than random).",
    ]
    if s.get("precision", "bf16 autocast (CPU)").startswith("bf16"):
        lines += ["", "**Rejected recipe (kept for the record).** Training under bf16 autocast on CPU learned far less "
                  "per step than fp32 (random, f = 0.1, seed 0: mean per-skill loss 3.55 after these 14 steps, 2.57 "
                  "after the same 14 steps in fp32), and the full-data run ended worse than the untrained model "
                  "(about 6.0 vs 5.0 nats on every skill). The grid of record trains in fp32: "
                  "[targeted_ni.md](targeted_ni.md)."]
    if result.get("room_check"):
        rc = result["room_check"]
        lines += ["", f"Room check (f = {rc['fraction']:g}, target {', '.join(rc['targets'])}, seed {rc['seed']}): "
                  f"random {rc['random']:.3f}, upper_bound {rc['upper_bound']:.3f} → room "
                  f"{rc['room']:.3f} nats ({'≥' if rc['room'] >= 0.2 else '<'} 0.2 required)."]
    steps_bad = []
    for row in result["summary"]:
        k, f = row["n_target_skills"], row["fraction"]
        arms = row["arms"]
        lines += ["", f"## {k} target skill{'s' if k > 1 else ''}, f = {f:g}", "",
                  "| arm | seeds | loss on target skills | loss on other skills | steps | kept rows of target "
                  "skills (of n kept) | train s |", "|---|---|---|---|---|---|---|"]
        random_steps = arms.get("random", {}).get("steps")
        for arm in s["arms"]:
            a = arms.get(arm)
            if a is None:
                continue
            flag = ""
            if arm != "full" and random_steps is not None and a["steps"] != random_steps:
                flag = " ≠ random!"
                steps_bad.append(f"{arm} at {k} targets, f = {f:g}")
            name = "full (seed 0, all rows)" if arm == "full" else arm
            seeds = f"1 run, {a['n_seeds']} draws" if arm == "full" else a["n_seeds"]
            lines.append(f"| {name} | {seeds} | {a['loss_target']:.3f} ± {a['loss_target_sd']:.3f} | "
                         f"{a['loss_other']:.3f} ± "
                         f"{a['loss_other_sd']:.3f} | {'/'.join(map(str, a['steps']))}{flag} | "
                         f"{a['kept_target_rows']:.1f} ({a['n_kept']:.0f}) | {a['seconds']:.0f} |")
        p = row["paired"]
        if p:
            lines += ["", "| paired difference (target skills) | mean ± sd | per seed | signs | other skills: mean "
                      "(per seed) |", "|---|---|---|---|---|"]
            for key in PAIRED_ROWS:
                if key in p:
                    d = p[key]
                    lines.append(f"| {key.replace('-', ' − ')} | {d['mean']:+.3f} ± {d['sd']:.3f} | "
                                 f"{_per_seed(d['per_seed'])} | {_signs(d['per_seed'])} | {d['other_mean']:+.3f} "
                                 f"({_per_seed(d['other_per_seed'])}) |")
        if row.get("kept_overlap_with_top_k"):
            lines += ["", "Kept rows shared by targeted and top_k_cosine (share of targeted's): " + ", ".join(
                f"seed {x}: {v:.0%}" for x, v in row["kept_overlap_with_top_k"].items()) + "."]
        elif row.get("targeted_equals_top_k_seeds"):
            lines += ["", f"targeted and top_k_cosine trained identically (the same losses to the last digit: the "
                      f"same kept rows) on seed(s) {', '.join(map(str, row['targeted_equals_top_k_seeds']))}."]
        g = row["gap_closed"]
        if g:
            room = next(iter(g.values()))
            lines += ["", f"Room random − upper_bound on the target skills: {room['room_mean']:.3f} nats "
                      f"(per seed {', '.join(f'{v:.3f}' for v in room['room_per_seed'])}). Gap closed:"]
            def share(v):
                return "undefined (no room)" if v is None else f"{v:+.2f}"

            lines += [f"- {arm}: mean {share(d['mean'])} (per seed {', '.join(share(v) for v in d['per_seed'])})"
                      for arm, d in g.items()]
    if steps_bad:
        lines += ["", f"**Unequal steps**: {'; '.join(steps_bad)}."]
    else:
        lines += ["", "Steps: every arm but `full` trained exactly the random arm's optimizer steps "
                  "(`trainer.state.global_step`) in every cell."]
    total = sum(r["wall_seconds"] for r in result["runs"])
    lines += ["", f"{len(result['runs'])} training runs, {total / 60:.1f} min in all (training, selection, "
              f"evaluation). Measured at commit{'s' if len(result['commits']) > 1 else ''} "
              f"{', '.join(f'`{c}`' for c in result['commits'])}."]
    return "\n".join(lines)


ARM_STYLE = {"random": ("tab:gray", "o"), "balanced_random": ("tab:brown", "s"), "untargeted": ("tab:blue", "^"),
             "targeted": ("tab:red", "D"), "top_k_cosine": ("tab:orange", "v"), "relevant_sample": ("tab:purple", "P"),
             "top_k_unbalanced": ("tab:olive", "X"),
             "upper_bound": ("tab:green", "*")}


def plot(result: dict, path: str) -> None:
    """Top row: loss on the target skills per arm (mean ± sd over seeds; the sd is mostly which skills each seed
    drew), one panel per target size, fractions on x. Bottom row: the paired per-seed difference arm − random on
    the target skills (mean ± sd over seeds; below 0 = better than random)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = result["settings"]["n_targets"]
    fig, axes = plt.subplots(2, len(ks), figsize=(4.6 * len(ks), 7.2), squeeze=False, sharey="row")
    fractions = result["settings"]["fractions"]
    offsets = np.linspace(-0.12, 0.12, len(ARM_STYLE)) * (min(np.diff(fractions)) if len(fractions) > 1 else 0.05)
    for column, k in enumerate(ks):
        ax, ax_diff = axes[0][column], axes[1][column]
        rows = [r for r in result["summary"] if r["n_target_skills"] == k]
        for (arm, (color, marker)), dx in zip(ARM_STYLE.items(), offsets):
            points = [(r["fraction"], r["arms"][arm]["loss_target"], r["arms"][arm]["loss_target_sd"])
                      for r in rows if arm in r["arms"]]
            if points:
                ax.errorbar([p[0] + dx for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                            color=color, marker=marker, capsize=3, label=arm, lw=1.2)
            diffs = []
            for f in fractions:
                cells = {(c["arm"], c["seed"]): c["loss_target"] for c in result["cells"]
                         if c["n_target_skills"] == k and c["fraction"] == f}
                d = [cells[(arm, x)] - cells[("random", x)] for x in result["settings"]["seeds"]
                     if (arm, x) in cells and ("random", x) in cells]
                if d and arm != "random":
                    diffs.append((f, float(np.mean(d)), _sd(d)))
            if diffs:
                ax_diff.errorbar([p[0] + dx for p in diffs], [p[1] for p in diffs], yerr=[p[2] for p in diffs],
                                 color=color, marker=marker, capsize=3, label=arm, lw=1.2)
        ax.set_title(f"{k} target skill{'s' if k > 1 else ''}")
        ax_diff.axhline(0.0, color="grey", lw=1)
        for a in (ax, ax_diff):
            a.set_xlabel("data_fraction")
            a.set_xticks(fractions)
            a.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out loss on target skills (nats)")
    axes[1][0].set_ylabel("arm − random, paired (nats)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Targeted selection, NI SFT (mean ± sd over seeds; lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def room_check(result: dict) -> dict | None:
    """upper_bound − random on the target skill at the largest fraction, 1 target, the first seed."""
    s = result["settings"]
    seed, fraction, k = s["seeds"][0], max(s["fractions"]), min(s["n_targets"])
    targets = draw_targets(seed, k)
    cells = {c["arm"]: c for c in result["cells"] if (c["seed"], c["fraction"], c["n_target_skills"]) ==
             (seed, fraction, k)}
    if "random" not in cells or "upper_bound" not in cells:
        return None
    r, u = cells["random"]["loss_target"], cells["upper_bound"]["loss_target"]
    return dict(seed=seed, fraction=fraction, targets=[result["skill_names"][x] for x in targets], random=r,
                upper_bound=u, room=r - u)


def finish(result: dict, out: str) -> None:
    """Cells, summary, room check from the runs; write JSON, and MD + PNG next to it."""
    result["cells"] = derive_cells(result)
    result["summary"] = summarise(result)
    result["room_check"] = room_check(result)
    result["commits"] = sorted({r.get("commit") for r in result["runs"] if r.get("commit")})
    bench_io.write_json(out, result)
    base = os.path.splitext(out)[0]
    if result["runs"]:
        with open(base + ".md", "w", encoding="utf-8") as handle:
            handle.write(markdown(result) + "\n")
        plot(result, base + ".png")
