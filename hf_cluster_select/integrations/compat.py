"""The transformers / TRL versions the adapters support, and the private hooks they override (layer L4).

`ClusterSelectMixin` overrides three private `Trainer` methods (no public seam exists for epochs of different
lengths) and calls three more. `HOOK_SIGNATURES` records their parameter names; `tests/test_compat.py` compares them
with the installed transformers, so a release that changes one fails in CI, not silently at a user's.

`SUPPORTED` gives, per package, the lowest supported release (setup.cfg's lower bound; CI's `make test-lowest` runs
the tests with exactly these) and the newest release CI has tested (information only: newer releases are not
refused, and setup.cfg has no upper bound, so the package installs next to whatever versions a user has).
`warn_if_unsupported` runs once when the adapters are imported: it warns, never refuses, when a package is older
than its lowest supported release or a hook's signature differs from `HOOK_SIGNATURES`.
"""

from __future__ import annotations

import inspect
import logging
from importlib import metadata
from typing import NamedTuple

from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)


class Supported(NamedTuple):
    lowest: str  # the lowest release the tests pass with (setup.cfg's lower bound)
    newest_tested: str  # the newest release CI has run the tests with (information, not a bound)


# Why these lowest releases (measured with tests/test_trainer.py, test_sft.py, test_compat.py, test_run.py):
# - transformers < 5.3: no `Trainer._run_epoch` / `_init_training_state`; < 5.15: no
#   `TrainingArguments.dataloader_multiprocessing_context` (ClusterTrainer builds its DataLoaders with it);
#   < 5.23: no `activation_checkpointing` argument (what ClusterSFTTrainer tells CPU users to turn off, and what the
#   SFT tests pass).
# - trl < 1.16: 1.4-1.14 resolve `loss_type` to 'chunked_nll' (ClusterSFTTrainer needs per-token 'nll' for its
#   loss weights), 1.15 computes the loss with a Triton kernel that CPU-only torch lacks, and <= 1.3 fail the SFT
#   masking / truncation tests. TRL 1.16 itself needs transformers >= 4.56.2 only.
# Newest: transformers 5.25.0 requires kernels>=0.19.1, which the package registry CI installs from lacks, so CI's
# newest environment resolves 5.24.0; 5.25.0 installed without that requirement passed the same four test files.
SUPPORTED = {
    "transformers": Supported(lowest="5.23.0", newest_tested="5.24.0"),
    "trl": Supported(lowest="1.16.0", newest_tested="1.16.0"),
}

HOOK_SIGNATURES = {  # Trainer method → parameter names (self included), the same in transformers 5.3 to 5.25
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

_warned = False  # warn_if_unsupported has run in this process


def too_old_versions() -> list[str]:
    """One sentence per installed package older than its lowest supported release (`SUPPORTED`); empty when none
    is. A package that is not installed, or whose version does not parse, is not reported."""
    problems = []
    for package, supported in SUPPORTED.items():
        try:
            installed = Version(metadata.version(package))
        except (metadata.PackageNotFoundError, InvalidVersion):
            continue
        if installed < Version(supported.lowest):
            problems.append(f"{package} {installed} (lowest supported: {supported.lowest})")
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


def warn_if_unsupported(trainer_class: type | None = None) -> None:
    """Log one warning naming every package older than its lowest supported release, and one naming every private
    hook of `trainer_class` (default `transformers.Trainer`) whose signature changed. Runs once per process (later
    calls do nothing); never raises for a version or a hook."""
    global _warned
    if _warned:
        return
    _warned = True
    old = too_old_versions()
    if old:
        logger.warning(
            "hf_cluster_select supports %s; installed: %s. Upgrade (`pip install -U %s`): selection overrides "
            "private Trainer hooks and relies on arguments that older releases lack.",
            ", ".join(f"{p}>={s.lowest}" for p, s in SUPPORTED.items()), "; ".join(old),
            " ".join(sorted(p.split()[0] for p in old)))
    if trainer_class is None:
        from transformers import Trainer as trainer_class
    changed = hook_mismatches(trainer_class)
    if changed:
        supported = SUPPORTED["transformers"]
        logger.warning(
            "transformers.Trainer hooks that hf_cluster_select overrides have changed: %s (expected the parameters of "
            "transformers %s to %s). Selection may fail or train on the wrong examples; please report it with your "
            "versions.", "; ".join(f"{name}({', '.join(params)})" if params else f"{name} (missing)"
                                   for name, params in changed.items()), supported.lowest, supported.newest_tested)
