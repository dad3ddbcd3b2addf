"""The private Trainer surface the adapter overrides: a transformers release that changes a hook fails here."""

from __future__ import annotations

import inspect
import logging

import transformers
import trl

from hf_cluster_select import ClusterSFTTrainer, ClusterTrainer
from hf_cluster_select.integrations import compat


def test_installed_versions_are_the_tested_ones():
    assert compat.untested_versions() == [], f"transformers {transformers.__version__}, trl {trl.__version__}"


def test_every_hook_keeps_its_signature():
    assert compat.hook_mismatches(transformers.Trainer) == {}
    assert compat.hook_mismatches(trl.SFTTrainer) == {}


def test_overrides_match_the_hooks_they_replace():
    """Our overrides take the parameters the Trainer passes (positional order included)."""
    for name in ("set_initial_training_values", "_init_training_state", "compute_loss"):
        ours = list(inspect.signature(getattr(ClusterTrainer, name)).parameters)
        assert ours == compat.HOOK_SIGNATURES[name], name
    run_epoch = list(inspect.signature(ClusterTrainer._run_epoch).parameters)
    assert run_epoch[:6] == compat.HOOK_SIGNATURES["_run_epoch"][:6]


def test_sft_trainer_init_keywords_are_bound():
    """ClusterSFTTrainer reads these SFTTrainer.__init__ arguments by name before TRL prepares the data."""
    params = inspect.signature(trl.SFTTrainer.__init__).parameters
    for name in ("args", "train_dataset", "processing_class", "formatting_func", "compute_loss_func"):
        assert name in params, name
    assert "hf_cluster_select" in ClusterSFTTrainer._tag_names


def test_untested_version_warns(monkeypatch, caplog):
    monkeypatch.setattr(compat, "TESTED_RANGES", {"transformers": ("0.1.0", "0.2.0")})
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        compat.warn_if_untested()
    assert f"transformers {transformers.__version__} (tested: >=0.1.0,<0.2.0)" in caplog.text


def test_changed_hook_is_reported():
    class Changed(transformers.Trainer):
        def _run_epoch(self, model, epoch):  # a hypothetical release with fewer parameters
            pass

    assert compat.hook_mismatches(Changed) == {"_run_epoch": ["self", "model", "epoch"]}


def test_setup_cfg_states_the_tested_range():
    """The install range users get is the range CI tests (`compat.TESTED_RANGES`), not wider."""
    import configparser
    import os

    from packaging.requirements import Requirement
    from packaging.version import Version

    parser = configparser.ConfigParser()
    parser.read(os.path.join(os.path.dirname(__file__), "..", "setup.cfg"))
    requirements = {Requirement(line).name: Requirement(line) for line in
                    parser["options"]["install_requires"].split("\n") if line.strip()}
    for package, (lowest, first_untested) in compat.TESTED_RANGES.items():
        bounds = {(s.operator, Version(s.version)) for s in requirements[package].specifier}
        assert bounds == {(">=", Version(lowest)), ("<", Version(first_untested))}, package
