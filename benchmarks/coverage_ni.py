"""Skill coverage at f = 0.1 on the NI quality pool (192 examples, 12 per skill, 16 skills): how many skills get no
kept example, per seed, under a random subset and the default selection with `kept_per_cluster` 4 (default), 2, 1.

    python benchmarks/coverage_ni.py      # ~1 minute; writes benchmarks/results/coverage_ni.json

Features of SmolLM2-135M-Instruct as loaded (LoRA at initialisation, no warm-up), selection only (no training): an exploration of
whether finer strata cover every skill at a small budget (issue 9's bar: each skill at least half its share).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import quality_tasks
from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.features import FEATURES
from hf_cluster_select.selection import cluster_features, select_subset, selection_budget
task = quality_tasks.load_ni(False)
model = task.make_model(0).eval()
out = FEATURES.get("badge")(model, task.train, list(range(len(task.train))), task.collator, batch_size=16,
                           lengths=[len(r["input_ids"]) for r in task.train], show_progress=False, shift_labels=True)
feats, lt = out.features.numpy(), out.loss_tokens.numpy()
groups = task.groups_train
n = len(groups); budget = selection_budget(n, 0.1)
res = {}
for arm in ["random", "kpc4", "kpc2", "kpc1"]:
    counts = []
    for seed in range(5):
        if arm == "random":
            idx = np.random.default_rng(seed).choice(n, budget, replace=False)
        else:
            c = ClusterSelectConfig(data_fraction=0.1, selection_seed=seed, kept_per_cluster=int(arm[3:]))
            r = cluster_features(feats, c, loss_tokens=lt); idx = select_subset(r, c, norms=out.norms.numpy(), losses=out.losses.numpy()).indices
        per = np.bincount(groups[idx], minlength=16)
        counts.append(int((per == 0).sum()))
    res[arm] = counts
result = {"task": "ni", "fraction": 0.1, "n_examples": n, "budget": budget, "seeds": list(range(5)),
          "features": "badge, base model, no warm-up", "skills_with_zero_kept_per_seed": res}
os.makedirs("benchmarks/results", exist_ok=True)
with open("benchmarks/results/coverage_ni.json", "w") as handle:
    json.dump(result, handle, indent=2)
print(json.dumps(result))
