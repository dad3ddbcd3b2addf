"""The transformers / TRL versions the adapters are tested with, and the private hooks they override (layer L4).

`ClusterSelectMixin` overrides three private `Trainer` methods (no public seam exists for epochs of different
lengths) and calls three more. `HOOK_SIGNATURES` records their parameter names in the tested versions;
`tests/test_compat.py` compares them with the installed transformers, so a release that changes one fails in CI,
not silently at a user's. `warn_if_untested` runs when the adapters are imported.
"""

from __future__ import annotations

import inspect
import logging
from importlib import metadata

from packaging.version import Version

logger = logging.getLogger(__name__)

# package: (lowest tested, first untested)
TESTED_RANGES = {"transformers": ("5.24.0", "5.25.0"), "trl": ("1.16.0", "1.17.0")}

HOOK_SIGNATURES = {  # Trainer method → parameter names (self included), as in transformers 5.24
    "set_initial_training_values": ["self", "args", "dataloader"],
    "_init_training_state": ["self", "max_steps", "num_update_steps_per_epoch", "num_train_epochs",
                             "resume_from_checkpoint", "trial"],
    "_run_epoch": ["self", "model", "epoch", "train_dataloader", "steps_in_epoch", "num_update_steps_per_epoch",
                   "trial", "ignore_keys_for_eval", "start_time", "resume_from_checkpoint", "epochs_trained",
                   "steps_trained_in_current_epoch"],
    "_remove_unused_columns": ["self", "dataset", "description"],
    "_get_collator_with_removed_columns": ["self", "data_collator", "description"],
    "get_total_train_batch_size": ["self", "args"],
    "get_train_dataloader": ["self"],
    "compute_loss": ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
}


def untested_versions() -> list[str]:
    """One sentence per installed package outside its tested range (`TESTED_RANGES`); empty when all are in it."""
    problems = []
    for package, (low, high) in TESTED_RANGES.items():
        try:
            installed = Version(metadata.version(package))
        except metadata.PackageNotFoundError:
            continue
        if not Version(low) <= installed < Version(high):
            problems.append(f"{package} {installed} (tested: >={low},<{high})")
    return problems


def hook_mismatches(trainer_class: type) -> dict[str, list[str]]:
    """Hooks of `trainer_class` whose parameters differ from `HOOK_SIGNATURES`: name → the parameters found
    (`[]` when the method is missing)."""
    found = {}
    for name, expected in HOOK_SIGNATURES.items():
        method = getattr(trainer_class, name, None)
        params = list(inspect.signature(method).parameters) if callable(method) else []
        if params != expected:
            found[name] = params
    return found


def warn_if_untested() -> None:
    """Log a warning naming every package outside its tested range and every changed private hook."""
    problems = untested_versions()
    if problems:
        logger.warning("hf_cluster_select is tested with %s; installed: %s. Selection overrides private Trainer "
                       "hooks, so check results on this version.", ", ".join(
                           f"{p} >={lo},<{hi}" for p, (lo, hi) in TESTED_RANGES.items()), "; ".join(problems))
    from transformers import Trainer

    changed = hook_mismatches(Trainer)
    if changed:
        logger.warning("transformers.Trainer hooks that hf_cluster_select overrides changed signature: %s.", changed)
