"""The private Trainer surface the adapter overrides: a transformers release that changes a hook fails here."""

from __future__ import annotations

import inspect
import logging

import pytest
import transformers
import trl
from packaging.version import Version

from hf_cluster_select import ClusterSFTTrainer, ClusterTrainer
from hf_cluster_select.integrations import compat


def test_installed_versions_are_supported():
    """CI runs this file in two environments: the newest releases (`make test`) and the lowest supported ones
    (`make test-lowest`); neither is below `compat.SUPPORTED`."""
    assert compat.too_old_versions() == [], f"transformers {transformers.__version__}, trl {trl.__version__}"


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


@pytest.fixture
def fresh_warning(monkeypatch, caplog):
    """`warn_if_unsupported` as on a first import: not yet run in this process, its log captured."""
    monkeypatch.setattr(compat, "_warned", False)
    caplog.set_level(logging.WARNING, logger=compat.__name__)
    return caplog


def test_installed_stack_gives_no_warning(fresh_warning):
    compat.warn_if_unsupported()
    assert fresh_warning.records == []


def test_too_old_version_warns_and_does_not_refuse(monkeypatch, fresh_warning):
    monkeypatch.setitem(compat.SUPPORTED, "transformers", compat.Supported("99.0.0", "99.1.0"))
    compat.warn_if_unsupported()  # no exception: a warning only
    assert len(fresh_warning.records) == 1
    assert compat.too_old_versions() == [f"transformers {transformers.__version__} (lowest supported: 99.0.0)"]
    assert "transformers>=99.0.0" in fresh_warning.text and compat.too_old_versions()[0] in fresh_warning.text


def test_changed_hook_is_named_in_the_warning(fresh_warning):
    class Changed(transformers.Trainer):
        def _run_epoch(self, model, epoch):  # a hypothetical release with fewer parameters
            pass

    assert compat.hook_mismatches(Changed) == {"_run_epoch": ["self", "model", "epoch"]}
    compat.warn_if_unsupported(Changed)
    hook_warnings = [r.getMessage() for r in fresh_warning.records if "hooks" in r.getMessage()]
    assert len(hook_warnings) == 1 and "_run_epoch(self, model, epoch)" in hook_warnings[0]


def test_missing_hook_is_named_in_the_warning(monkeypatch, fresh_warning):
    monkeypatch.delattr(transformers.Trainer, "_init_training_state")
    compat.warn_if_unsupported()
    assert "_init_training_state (missing)" in fresh_warning.text


def test_warns_once_per_process(monkeypatch, fresh_warning):
    monkeypatch.setitem(compat.SUPPORTED, "trl", compat.Supported("99.0.0", "99.0.0"))
    compat.warn_if_unsupported()
    compat.warn_if_unsupported()
    assert len(fresh_warning.records) == 1


def test_import_of_the_adapters_checks_the_hooks():
    import hf_cluster_select.integrations.trainer  # noqa: F401  (imported by the imports above already)

    assert compat._warned


def test_setup_cfg_states_the_lowest_supported_versions():
    """setup.cfg's lower bounds are `compat.SUPPORTED`'s lowest releases (what `make test-lowest` installs), and
    there is no upper bound: a plugin pinned to one minor release conflicts with the versions users have."""
    import configparser
    import os
    import re

    from packaging.requirements import Requirement

    root = os.path.join(os.path.dirname(__file__), "..")
    parser = configparser.ConfigParser()
    parser.read(os.path.join(root, "setup.cfg"))
    requirements = {Requirement(line).name: Requirement(line) for line in
                    parser["options"]["install_requires"].split("\n") if line.strip()}
    with open(os.path.join(root, "Makefile")) as makefile:
        lowest_env = dict(re.findall(r"^LOWEST_(\w+) = (\S+)$", makefile.read(), re.M))
    for package, supported in compat.SUPPORTED.items():
        bounds = {(s.operator, Version(s.version)) for s in requirements[package].specifier}
        assert bounds == {(">=", Version(supported.lowest))}, package
        assert Version(lowest_env[package.upper()]) == Version(supported.lowest), package
        assert Version(supported.lowest) <= Version(supported.newest_tested), package
