"""Skill coverage at f = 0.1 on the NI quality pool (192 examples, 12 per skill, 16 skills): how many skills get no
kept example, per seed, under a random subset and the default selection with `kept_per_cluster` 4 (default), 2, 1,
for each feature signal (`auto`, the default, is `hidden_mean` after 20 of SmolLM2's 30 blocks), on the benchmark's prompts (`ni`: the skill's one-sentence instruction, then the input) and
on the stripped prompts (`ni_stripped`: the input alone).

    python benchmarks/coverage_ni.py      # ~4 minutes; writes benchmarks/results/coverage_ni.json

Features of SmolLM2-135M-Instruct as loaded (LoRA at initialisation, no warm-up), selection only (no training): issue
9's bar is each skill at least half its proportional share (here: at least one of the 19 kept examples). Also, per
feature, how well KMeans told K = 16 on the L2-normalised features recovers the skills (`ari_kmeans16`).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from sklearn.cluster import KMeans  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402
import quality_tasks  # noqa: E402
from hf_cluster_select import ClusterSelectConfig  # noqa: E402
from hf_cluster_select.features import FEATURES, describe_feature, resolve_feature  # noqa: E402
from hf_cluster_select.features.proxy import truncated_layers  # noqa: E402
from hf_cluster_select.selection import cluster_features, select_subset, selection_budget  # noqa: E402

SEEDS = range(5)


def zero_kept(task, feature: str | None) -> dict[str, list[int]]:
    """Skills with no kept example per seed: `feature=None` is the random subset, else kept_per_cluster 4 / 2 / 1."""
    groups = task.groups_train
    n = len(groups)
    budget = selection_budget(n, 0.1)
    if feature is None:
        return {"random": [int((np.bincount(groups[np.random.default_rng(s).choice(n, budget, replace=False)],
                                            minlength=task.n_groups) == 0).sum()) for s in SEEDS]}
    model = task.make_model(0).eval()
    name, layers = resolve_feature(model, feature, None)  # "auto": hidden_mean after 20 of 30 blocks
    with truncated_layers(model, layers):
        out = FEATURES.get(name)(model, task.train, list(range(n)), task.collator, batch_size=16,
                                 lengths=[len(r["input_ids"]) for r in task.train], show_progress=False,
                                 shift_labels=True)
    unit = out.features.numpy() / np.linalg.norm(out.features.numpy(), axis=1, keepdims=True)
    res = {f"{feature} ({describe_feature(name, layers)})/ari_kmeans16": round(float(adjusted_rand_score(
        groups, KMeans(task.n_groups, n_init=10, random_state=0).fit_predict(unit))), 3)}
    for kpc in (4, 2, 1):
        counts = []
        for seed in SEEDS:
            c = ClusterSelectConfig(data_fraction=0.1, selection_seed=seed, feature=feature, strategy_kwargs={"kept_per_cluster": kpc})
            r = cluster_features(out.features.numpy(), c, loss_tokens=out.loss_tokens.numpy())
            idx = select_subset(r, c, norms=out.norms.numpy(), losses=out.losses.numpy()).indices
            counts.append(int((np.bincount(groups[idx], minlength=task.n_groups) == 0).sum()))
        res[f"{feature} ({describe_feature(name, layers)})/kpc{kpc}"] = counts
    return res


def main() -> None:
    result = {"fraction": 0.1, "seeds": list(SEEDS), "features": "base model, no warm-up",
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip(),
              "skills_with_zero_kept_per_seed": {}}
    for name in ("ni", "ni_stripped"):
        task = quality_tasks.TASKS[name](False)
        result["n_examples"], result["budget"] = len(task.train), selection_budget(len(task.train), 0.1)
        cell = {}
        for feature in (None, "auto", "badge", "last_layer_grad", "hidden_mean"):
            cell.update(zero_kept(task, feature))
            print(name, json.dumps(cell), flush=True)
        result["skills_with_zero_kept_per_seed"][name] = cell
    os.makedirs("benchmarks/results", exist_ok=True)
    with open("benchmarks/results/coverage_ni.json", "w") as handle:
        json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
