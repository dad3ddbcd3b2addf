"""Each default is decided once: a function parameter named after a `ClusterSelectConfig` field or a strategy setting
either has no default or the config's / settings class's own (issue: `balance_window` 16 in the config but 8 in the
sampler, `within_cluster` 'facility_location' in the config but 'peripheral' in `select_from_labels`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import hf_cluster_select
from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.config import registered_settings
from hf_cluster_select.registry import STAGES

# parameter names that stand for a config field or setting under a shorter name
ALIASES = {"seed": "selection_seed", "window": "balance_window", "warmup_steps": "selection_warmup_steps"}
SKIP_MODULES = ("hf_cluster_select.demo",)  # the demo's own command-line defaults are the demo's recipe


def config_defaults() -> dict[str, object]:
    defaults = {f.name: f.default for f in dataclasses.fields(ClusterSelectConfig)}
    for name, takers in registered_settings().items():
        assert len({repr(f.default) for _, _, f in takers}) == 1, f"{name} has two defaults across strategies"
        assert name not in defaults, f"{name} is a field and a setting"
        defaults[name] = takers[0][2].default
    return defaults


def package_functions():
    for info in pkgutil.walk_packages(hf_cluster_select.__path__, "hf_cluster_select."):
        if info.name.startswith(SKIP_MODULES) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{obj.__qualname__}", obj
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if inspect.isfunction(member):
                        yield f"{module.__name__}.{obj.__qualname__}.{attr}", member


def test_every_default_a_function_takes_comes_from_the_config():
    defaults = config_defaults()
    mismatches, checked = [], 0
    for name, function in package_functions():
        for param in inspect.signature(function).parameters.values():
            key = ALIASES.get(param.name, param.name)
            if key not in defaults or not isinstance(param.default, (type(None), bool, int, float, str)):
                continue  # no default, or not a setting's (a dataclass field's factory, say)
            checked += 1
            if param.default != defaults[key] and not (param.default is None and key == "selection_warmup_steps"):
                mismatches.append(f"{name}({param.name}={param.default!r}), config: {defaults[key]!r}")
    assert mismatches == []
    assert checked >= 10  # the check reached the functions that take such parameters


def test_the_check_catches_a_second_default(monkeypatch):
    """The test above can fail: a function whose `balance_window`-like parameter defaults to 8 is reported."""
    def plan(labels, window=8):
        return labels

    defaults = config_defaults()
    param = inspect.signature(plan).parameters["window"]
    assert param.default != defaults[ALIASES[param.name]]


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_strategy_setting_has_help(stage):
    for name in STAGES[stage].names():
        for f in dataclasses.fields(STAGES[stage].settings_class(name)):
            assert f.metadata.get("help"), f"{stage}={name!r}: setting {f.name} has no help"


def test_balance_tokens_auto_is_on_with_several_ranks_or_a_tokens_budget():
    from hf_cluster_select.settings import AllocationSettings, resolve_balance_tokens

    assert AllocationSettings().balance_tokens == "auto"
    assert [resolve_balance_tokens("auto", w) for w in (1, 2, 8)] == [False, True, True]
    assert resolve_balance_tokens("auto", 1, "tokens") is True
    assert resolve_balance_tokens(True, 1) is True and resolve_balance_tokens(False, 4) is False
    with pytest.raises(TypeError, match="balance_tokens"):
        resolve_balance_tokens("yes", 1)
    with pytest.raises(TypeError, match="balance_tokens"):
        AllocationSettings(balance_tokens="on")
