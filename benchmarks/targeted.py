"""Targeted selection in real SFT: does `ClusterTrainer(target_dataset=...)` keep the pool rows that teach the
target skills, at the random subset's optimizer steps?

    python benchmarks/targeted.py                  # the grid → results/targeted_ni.{json,md,png} (resumes)
    python benchmarks/targeted.py --room-check     # first: random vs upper_bound, f = 0.1, 1 target, seed 0
    python benchmarks/targeted.py --report-only    # MD and PNG again from the JSON
    python benchmarks/targeted.py --quick          # ~1-2 minute smoke run → results/targeted_ni_quick.json

Task (issue 21): the 16-skill Natural-Instructions sample (`probe_data.NI_PATHS`), SmolLM2-135M-Instruct with LoRA
r = 8 on q/v (`quality_tasks.load_ni`'s model and collator, reused), prompt = the skill's one-sentence instruction
(`quality_tasks.task_instruction`, ≤ 48 tokens) + input (last ≤ 80 tokens), loss on the target (≤ 40 tokens +
EOS), tokenized exactly as `load_ni` tokenizes a row. Per skill, one permutation of its examples seeded by
`quality_tasks.POOL_SEED` (the same permutation as `load_ni`'s) gives, in this order, `--pool` pool rows, `--eval`
held-out evaluation rows and 8 target rows; pool, evaluation and target rows never overlap, and the pool is the
same for every seed and target.

Targets: 1, 2 and 4 skills; per (run seed, n_targets) the skills are `default_rng([seed, n_targets, 21])
.choice(16, n_targets, replace=False)` (independent draws: the 1-skill target is not nested in the 2-skill one).
The target set is the 8 target rows of each target skill, in the pool's format plus a `skill` column; with 2 or 4
skills `target_column="skill"` makes each skill a target task (equal shares, round-robin); with 1 skill the column is
left out (the package refuses a column with a single value; one task is the default).

Arms (B = `selection_budget(N, f)` rows; every arm trains the same recipe and therefore the same optimizer steps,
ceil(B / 8) per epoch — checked: `steps` = `trainer.state.global_step` is recorded per run and the Markdown flags
any arm whose steps differ from random's):
- `random`: stock `Trainer` on B uniformly random pool rows (`default_rng([seed, 7])`, as `quality.py`);
- `balanced_random` (oracle): B rows stratified by the true skill, ⌊B/16⌋ per skill plus one more for B mod 16
  skills drawn at random (`default_rng([seed, 11])`);
- `untargeted`: `ClusterTrainer`, no target (package defaults otherwise);
- `targeted`: `ClusterTrainer(target_dataset=...)`, `target_rule="cluster_relevance"` (ours);
- `top_k_cosine`: `ClusterTrainer(target_dataset=...)`, `target_rule="top_k_cosine"` (RDS+: rows by their max cosine
  to the target, clusters ignored);
- `relevant_sample`: `target_rule="relevant_sample"` (a seeded random sample of each task's relevant region);
- `top_k_unbalanced`: top_k_cosine with `balance_tokens=False` — fixed batches of 8, what the package does on one
  process since `balance_tokens="auto"` (the default configuration now); every other ClusterTrainer arm sets
  `balance_tokens=True` (token-budget batches, the one-process default when they were measured), so a rerun
  reproduces them;
- `upper_bound`: B random rows of the target skills' pool rows only (`default_rng([seed, 13, n_targets])`); when
  B exceeds them (1 target at f = 0.1: B = 51 > 32) all of them plus B − k·P of them drawn again (at most twice
  each), so the steps stay equal;
- `top_k_coverage25`, `top_k_weighted_mean` (variants, not in the default grid; `--arms` to run them):
  top_k_cosine with `target_coverage=0.25`, and with RDS+'s pooling (`feature="hidden_weighted_mean"`, block 20);
- `full`: stock `Trainer` on all N pool rows, seed 0 only (a reference: N/8 steps per epoch, not equal steps),
  evaluated on every held-out row, so each seed's target draw reads its loss from the same run.
Every ClusterTrainer arm uses `ClusterSelectConfig(data_fraction=f, selection_warmup_steps=0, selection_seed=seed)`
(plus `balance_tokens` as above):
features from the base model (as RDS+), no warm-up steps (none are counted: the selection trains exactly the
random arm's steps). The feature cache is on ($HF_CLUSTER_SELECT_CACHE, default here /tmp/targeted_ni_features_fp32):
with warm-up 0 the untargeted/targeted/top_k_cosine runs of a seed (both fractions) share the pool's features, and
targeted/top_k_cosine share the target's. `random`, `balanced_random`, `untargeted` and `full` do not depend on
the target: one training run each per (fraction, seed) serves all three target sizes (`runs` vs `cells` in the JSON).
The model (LoRA init) is `load_ni`'s `make_model(seed)`; the trainer seed is the run seed, for every arm alike.

Recipe (the same for every arm, written into the JSON's `recipe`): AdamW, LR `--learning-rate` (default 2e-3), linear
decay with a 10 % warm-up, batch 8, `--epochs` epochs (default 1) over the arm's rows, so 4 optimizer steps at
f = 0.05 (B = 26) and 7 at f = 0.1 (B = 51). Training (feature pass included) in fp32; the evaluation under
`torch.autocast("cpu", dtype=torch.bfloat16)` (an fp32-trained model scored 3.6050 with it, 3.6044 without). A first
grid trained under bf16 autocast too (`--bf16-train`, 2 epochs, `results/targeted_ni_bf16.*`); it was rejected:
bf16 training learned far less per step (random, f = 0.1, seed 0: mean per-skill loss 3.55 after 14 bf16 steps,
2.57 after the same 14 fp32 steps) and its full-data run ended worse than the base model (6.0 vs 5.0 nats). One torch
thread by default (`--threads`): on the shared 2-core machine two threads were 2-4x slower than one. Room check
(issue 21: the recipe must leave room for targeting): at f = 0.1, 1 target skill, seed 0, upper_bound beats random
by ≥ 0.2 nats on the target skill (`--room-check` runs just those two cells of the grid).

Metric (lower is better): per held-out row the mean cross-entropy over its target tokens (as `load_ni`'s evaluate),
averaged per skill, then over skills: `loss_target` over the target skills with all `--eval` rows of each (the main
metric), `loss_other` over the other skills with the first `--other-eval` rows of each (the trade-off; fewer rows to
save evaluation time, the same rows for every arm). Reported per n_targets × fraction: mean ± sd over seeds; the
paired per-seed differences of `targeted` against random, balanced_random and top_k_cosine (negative = targeted
better) with each seed's sign; and the share of the random → upper_bound gap that targeted (and top_k_cosine)
closes, (random − arm) / (random − upper_bound), per seed and mean.

The JSON is written after every run (an interrupted run keeps what it finished; a rerun with the same settings
skips finished runs; other settings are refused unless `--out` names another file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_CLUSTER_SELECT_CACHE", "/tmp/targeted_ni_features_fp32")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import bench_io  # noqa: E402
import probe_data  # noqa: E402
import quality_tasks  # noqa: E402
from targeted_report import (FOCAL_ARMS, N_SKILLS, N_TARGETS, SHARED_ARMS, TARGET_PER_SKILL,  # noqa: E402,F401
                             draw_targets, finish, markdown, run_key)

ARMS = ("random", "balanced_random", "untargeted", "targeted", "top_k_cosine", "relevant_sample",
        "top_k_coverage25", "top_k_weighted_mean", "top_k_unbalanced", "upper_bound", "full")
DEFAULT_ARMS = ("random", "balanced_random", "untargeted", "targeted", "top_k_cosine", "relevant_sample",
                "top_k_unbalanced", "upper_bound", "full")
# ClusterTrainer arms with a target: their config fields and settings (`ClusterSelectConfig.from_flat`)
TARGET_RULES = {"targeted": {"target_rule": "cluster_relevance"}, "top_k_cosine": {"target_rule": "top_k_cosine"},
                "relevant_sample": {"target_rule": "relevant_sample"},
                "top_k_unbalanced": {"target_rule": "top_k_cosine", "balance_tokens": False},  # the default now
                "top_k_coverage25": {"target_rule": "top_k_cosine", "target_coverage": 0.25},
                "top_k_weighted_mean": {"target_rule": "top_k_cosine", "feature": "hidden_weighted_mean",
                                        "feature_layers": 20}}  # RDS+'s pooling, after the blocks 'auto' takes
FRACTIONS = (0.05, 0.1)
SEEDS = (0, 1, 2)
RESULTS = os.path.join(HERE, "results")


# ---- data ---------------------------------------------------------------------------------------------------------
def ni_row(tokenizer, task: dict, example: dict, skill: int) -> dict:
    """One Natural-Instructions row tokenized as `quality_tasks.load_ni` does (instruction sentence ≤ 48 tokens +
    input's last ≤ 80 tokens → target ≤ 40 tokens + EOS, loss on the target); `load_ni` builds its rows inline, so
    this mirrors it line for line."""
    from hf_cluster_select.loss_tokens import IGNORE_INDEX

    target = example["target"][0] if isinstance(example["target"], list) else example["target"]
    prompt = tokenizer(example["input"].strip() + "\n", add_special_tokens=False)["input_ids"][-80:]
    prompt = tokenizer(quality_tasks.task_instruction(task["task_prefix"]) + "\n",
                       add_special_tokens=False)["input_ids"][:48] + prompt
    reply = tokenizer(" " + str(target).strip(), add_special_tokens=False)["input_ids"][:40]
    reply = reply + [tokenizer.eos_token_id]
    return {"input_ids": prompt + reply, "labels": [IGNORE_INDEX] * len(prompt) + reply,
            "attention_mask": [1] * (len(prompt) + len(reply)), "skill": skill}


def build_data(per_skill_pool: int, per_skill_eval: int) -> dict:
    """Pool (a `datasets.Dataset` without the skill column), the skill of every pool row, the held-out rows per skill
    and the 8 target rows per skill (lists of row dicts), the skill names, and the model/collator of `load_ni`."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from hf_cluster_select.demo.smollm2 import ensure_smollm2

    path = next(p for p in probe_data.NI_PATHS if os.path.isfile(p))
    with open(path, encoding="utf-8") as handle:
        tasks = json.load(handle)["tasks"]
    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2())
    rng = np.random.default_rng(quality_tasks.POOL_SEED)
    pool, held_out, target = [], {}, {}
    for skill, task in enumerate(tasks):
        order = rng.permutation(len(task["examples"]))
        cut = (per_skill_pool, per_skill_pool + per_skill_eval, per_skill_pool + per_skill_eval + TARGET_PER_SKILL)
        rows = [ni_row(tokenizer, task, task["examples"][int(i)], skill) for i in order[:cut[2]]]
        pool += rows[:cut[0]]
        held_out[skill] = rows[cut[0]:cut[1]]
        target[skill] = rows[cut[1]:cut[2]]
    skills = np.asarray([r["skill"] for r in pool])
    base = quality_tasks.load_ni(quick=True)  # only for its make_model (LoRA r=8 q/v) and collator: reused as is
    return dict(pool=Dataset.from_list(pool).remove_columns("skill"), skills=skills, held_out=held_out,
                target=target, names=[t["name"] for t in tasks], make_model=base.make_model, collator=base.collator,
                base_recipe=base.recipe)


def target_dataset(data: dict, targets: list[int]):
    """The target set: the 8 target rows of each target skill, pool format plus a `skill` column (the skill name)."""
    from datasets import Dataset

    rows = [dict(r, skill=data["names"][s]) for s in targets for r in data["target"][s]]
    return Dataset.from_list(rows)


# ---- arms -----------------------------------------------------------------------------------------------------------
def stock_indices(arm: str, skills: np.ndarray, budget: int, seed: int, targets: list[int] | None) -> np.ndarray:
    """Pool rows of the stock-Trainer arms (sorted; `upper_bound` may repeat rows when B exceeds the target rows)."""
    n = skills.size
    if arm == "full":
        return np.arange(n)
    if arm == "random":
        return np.sort(np.random.default_rng([seed, 7]).choice(n, size=budget, replace=False))
    if arm == "balanced_random":
        rng = np.random.default_rng([seed, 11])
        quota = np.full(N_SKILLS, budget // N_SKILLS)
        quota[rng.choice(N_SKILLS, size=budget % N_SKILLS, replace=False)] += 1
        return np.sort(np.concatenate([rng.choice(np.flatnonzero(skills == s), size=q, replace=False)
                                       for s, q in enumerate(quota) if q]))
    if arm == "upper_bound":
        rng = np.random.default_rng([seed, 13, len(targets)])
        rows = np.flatnonzero(np.isin(skills, targets))
        chosen = [rng.choice(rows, size=min(budget, rows.size), replace=False)]
        while sum(c.size for c in chosen) < budget:  # B > the target skills' rows: draw them again, equal steps
            chosen.append(rng.choice(rows, size=min(budget - sum(c.size for c in chosen), rows.size), replace=False))
        return np.sort(np.concatenate(chosen))
    raise ValueError(arm)


def cluster_config(arm: str, fraction: float, seed: int, targets: list[int] | None):
    from hf_cluster_select import ClusterSelectConfig

    # every ClusterTrainer arm but top_k_unbalanced was measured with token-budget batches, the one-process default
    # before `balance_tokens="auto"`: they keep it, so a rerun reproduces them (top_k_unbalanced = today's default)
    values = dict(data_fraction=fraction, selection_warmup_steps=0, selection_seed=seed, balance_tokens=True)
    if arm in TARGET_RULES:
        values.update(TARGET_RULES[arm])
        if len(targets) > 1:
            values["target_column"] = "skill"
    return ClusterSelectConfig.from_flat(values)


def autocast():
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def evaluate(model, data: dict, rows_per_skill: dict[int, int], batch_size: int = 16) -> dict[str, list[float]]:
    """Per skill, the per-row mean target-token loss of its first `rows_per_skill[skill]` held-out rows (as
    `load_ni`'s evaluate, batch 1 there; here batched, the LM head applied to the label positions only)."""
    import torch

    from hf_cluster_select.loss_tokens import IGNORE_INDEX

    rows = [(s, i, r) for s, k in rows_per_skill.items() for i, r in enumerate(data["held_out"][s][:k])]
    rows.sort(key=lambda x: len(x[2]["input_ids"]))
    base = model.get_base_model()
    out: dict[int, list] = {s: [None] * min(k, len(data["held_out"][s])) for s, k in rows_per_skill.items()}
    model.eval()
    with torch.no_grad(), autocast():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            batch = data["collator"]([{k: r[k] for k in ("input_ids", "labels", "attention_mask")}
                                      for _, _, r in chunk])
            hidden = base.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            labels = batch["labels"][:, 1:]
            mask = labels != IGNORE_INDEX
            logits = base.lm_head(hidden[:, :-1][mask]).float()
            token_loss = torch.nn.functional.cross_entropy(logits, labels[mask], reduction="none")
            row_of = torch.arange(len(chunk))[:, None].expand_as(labels)[mask]
            sums = torch.zeros(len(chunk)).index_add_(0, row_of, token_loss)
            per_row = sums / mask.sum(1).clamp(min=1)
            for (s, i, _), value in zip(chunk, per_row.tolist()):
                out[s][i] = value
    return {str(s): v for s, v in out.items()}


def run_one(data: dict, recipe: dict, arm: str, fraction: float, seed: int, targets: list[int] | None,
            eval_rows: dict[int, int], work: str, bf16_train: bool = False) -> dict:
    """Train one arm and evaluate it; returns the run record."""
    import torch
    from transformers import Trainer, TrainingArguments

    from hf_cluster_select import ClusterTrainer
    from hf_cluster_select.selection import selection_budget

    wall = time.perf_counter()
    pool, skills = data["pool"], data["skills"]
    n = len(pool)
    budget = n if arm == "full" else selection_budget(n, fraction)
    args = TrainingArguments(output_dir=work, seed=seed, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0, **recipe)
    model = data["make_model"](seed)
    extra: dict = {}
    if arm in TARGET_RULES or arm == "untargeted":
        trainer = ClusterTrainer(model=model, args=args, train_dataset=pool, data_collator=data["collator"],
                                 target_dataset=target_dataset(data, targets) if arm in TARGET_RULES else None,
                                 cluster_config=cluster_config(arm, fraction, seed, targets))
    else:
        indices = stock_indices(arm, skills, budget, seed, targets)
        trainer = Trainer(model=model, args=args, train_dataset=pool.select(indices), data_collator=data["collator"])
    start = time.perf_counter()
    with autocast() if bf16_train else contextlib.nullcontext():  # fp32 by default: see the module docstring
        trainer.train()
    seconds = time.perf_counter() - start
    if isinstance(trainer, ClusterTrainer):
        indices = np.asarray(trainer.selection.indices)
        report = trainer.selection_report
        extra = dict(n_clusters=int(report.n_clusters), selection_seconds=float(report.selection_seconds),
                     features_from_cache=bool(getattr(report, "features_from_cache", False)))
        if report.target is not None:
            extra["target_report"] = {k: v for k, v in report.target.items() if k != "cluster_relevance"}
    start = time.perf_counter()
    losses = evaluate(trainer.model, data, eval_rows)
    eval_seconds = time.perf_counter() - start
    record = dict(arm=arm, fraction=1.0 if arm == "full" else fraction, seed=seed, targets=targets,
                  n_target_skills=None if targets is None else len(targets), steps=int(trainer.state.global_step),
                  seconds=seconds, eval_seconds=eval_seconds, wall_seconds=time.perf_counter() - wall,
                  n_kept=int(indices.size), n_kept_distinct=int(np.unique(indices).size),
                  kept_per_skill=np.bincount(skills[indices], minlength=N_SKILLS).tolist(),
                  kept=None if arm == "full" else [int(i) for i in indices], losses=losses, **extra)
    del trainer, model
    return record


# ---- the grid -------------------------------------------------------------------------------------------------------
def plan_runs(settings: dict, only_room: bool) -> list[tuple]:
    """(arm, fraction, seed, targets, eval rows per skill) in run order: per seed and fraction the shared arms,
    then per target size the target arms; `full` last. The shared arms are evaluated on every row of each skill
    that any target size of `N_TARGETS` (or of the settings) draws for that seed, so a later run that adds a
    target size reads them as they are. `only_room`: the grid's own random and upper_bound runs at the largest
    fraction, the smallest target size, the first seed."""
    full_rows = settings["eval_per_skill"]
    other = settings["other_eval"]
    n_targets, fractions, seeds, arms = (settings[k] for k in ("n_targets", "fractions", "seeds", "arms"))
    runs = []
    for seed in seeds:
        union = set().union(*(draw_targets(seed, k) for k in set(N_TARGETS) | set(n_targets)))
        shared_rows = {s: full_rows if s in union else other for s in range(N_SKILLS)}
        for fraction in fractions:
            runs += [(arm, fraction, seed, None, shared_rows) for arm in arms
                     if arm in SHARED_ARMS and arm != "full"]
            for k in n_targets:
                targets = draw_targets(seed, k)
                rows = {s: full_rows if s in targets else other for s in range(N_SKILLS)}
                runs += [(arm, fraction, seed, targets, rows) for arm in arms if arm not in SHARED_ARMS]
    if "full" in arms:
        runs.append(("full", 1.0, seeds[0], None, {s: full_rows for s in range(N_SKILLS)}))
    if only_room:
        room = (max(fractions), seeds[0], draw_targets(seeds[0], min(n_targets)))
        runs = [r for r in runs if (r[0] == "random" and r[1:3] == room[:2])
                or (r[0] == "upper_bound" and r[1:4] == room)]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="result JSON (default results/targeted_ni.json, "
                                                    "results/targeted_ni_quick.json with --quick)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the MD and PNG from the JSON and exit")
    parser.add_argument("--room-check", action="store_true", help="run only random and upper_bound at the largest "
                        "fraction, 1 target skill, the first seed (they are the grid's own runs)")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (4 pool rows per skill, 1 seed)")
    parser.add_argument("--pool", type=int, default=32, help="pool rows per skill")
    parser.add_argument("--eval", type=int, default=8, help="held-out rows per target skill")
    parser.add_argument("--other-eval", type=int, default=4, help="held-out rows per other skill")
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--n-targets", type=int, nargs="+", default=list(N_TARGETS))
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS,
                        help="default: the grid's seven arms; top_k_coverage25 and top_k_weighted_mean are variants "
                             "run on request")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see the docstring)")
    parser.add_argument("--bf16-train", action="store_true", help="train under bf16 autocast too (the rejected "
                        "recipe of results/targeted_ni_bf16.json: it learns much less per step)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(RESULTS, "targeted_ni_quick.json" if args.quick else "targeted_ni.json")
    if args.report_only:
        with open(out, encoding="utf-8") as handle:
            result = json.load(handle)
        finish(result, out)
        print(markdown(result))
        return 0
    if args.quick:
        args.pool, args.eval, args.other_eval, args.epochs = 4, 2, 1, 1
        args.fractions, args.seeds, args.n_targets = [0.125], [0], [2]
        args.arms = [a for a in ARMS if a != "full"]
    import torch

    torch.set_num_threads(args.threads)
    recipe = dict(num_train_epochs=args.epochs, learning_rate=args.learning_rate, per_device_train_batch_size=8,
                  per_device_eval_batch_size=8, warmup_steps=0.1, lr_scheduler_type="linear")
    if args.quick:
        recipe["per_device_train_batch_size"] = recipe["per_device_eval_batch_size"] = 4
    settings = dict(pool_per_skill=args.pool, eval_per_skill=args.eval, other_eval=min(args.other_eval, args.eval),
                    fractions=sorted(args.fractions), seeds=args.seeds, n_targets=sorted(args.n_targets),
                    arms=[a for a in ARMS if a in args.arms], threads=args.threads,
                    precision=("bf16 autocast (CPU) for training and evaluation" if args.bf16_train else
                               "fp32 training, bf16-autocast evaluation"))
    result = {"task": "ni_targeted", "quick": args.quick, "recipe": recipe, "settings": settings, "runs": []}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as handle:
            earlier = json.load(handle)
        keys = ("pool_per_skill", "eval_per_skill", "other_eval", "precision")
        same = (earlier.get("recipe") == json.loads(json.dumps(recipe))
                and all(earlier["settings"].get(k) == settings[k] for k in keys))
        if not same:
            parser.error(f"{out} holds another recipe or data setting ({earlier.get('recipe')}, "
                         f"{ {k: earlier['settings'].get(k) for k in keys} }); pass --out for a new file")
        result["runs"] = earlier["runs"]
        merged = dict(earlier["settings"])  # a rerun may widen the grid: keep every seed/fraction/arm measured
        for key in ("fractions", "seeds", "n_targets"):
            merged[key] = sorted(set(merged[key]) | set(settings[key]))
        merged["arms"] = [a for a in ARMS if a in set(merged["arms"]) | set(settings["arms"])]
        result["settings"] = merged
    data = build_data(args.pool, args.eval)
    result["n_pool"] = len(data["pool"])
    result["skill_names"] = data["names"]
    commit = os.popen(f"git -C {HERE} rev-parse --short HEAD").read().strip()
    done = {run_key(r["arm"], r["fraction"], r["seed"], r["targets"]) for r in result["runs"]}
    work = os.path.join("/tmp", f"targeted_ni_{os.getpid()}")
    todo = [r for r in plan_runs(settings, args.room_check) if run_key(*r[:4]) not in done]
    print(f"{len(todo)} runs to do ({len(done)} already in {out})", flush=True)
    start = time.perf_counter()
    for i, (arm, fraction, seed, targets, rows) in enumerate(todo):
        record = run_one(data, recipe, arm, fraction, seed, targets, rows, os.path.join(work, arm),
                         bf16_train=args.bf16_train)
        record["commit"] = commit
        result["runs"].append(record)
        finish(result, out)
        brief = {k: v for k, v in record.items() if k not in ("losses", "kept", "kept_per_skill", "target_report")}
        brief.update(elapsed_min=round((time.perf_counter() - start) / 60, 1), done=f"{i + 1}/{len(todo)}")
        print(json.dumps(brief), flush=True)
    finish(result, out)
    if result["room_check"]:
        print("room check:", json.dumps(result["room_check"]), flush=True)
    print(f"total {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
