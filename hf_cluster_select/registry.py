"""A name → strategy table, each strategy with its settings class (layer L0: imports nothing from the package
statically).

Each pipeline stage has one `Registry` of interchangeable strategies: `FEATURES` (`ClusterSelectConfig.feature`),
`CLUSTERERS` (`cluster_method`), `WITHIN_CLUSTER_RULES` (`within_cluster`) and `ALLOCATIONS` (`allocation`);
`TARGET_RULES` holds the rankings of targeted selection (the `target_rule` setting, `settings.TargetSettings`). The
built-in strategies register themselves in their stage modules (`features/`, `selection/`, `batching/`); a registry
imports its stage's module the first time it is asked for a name, so the accepted names and their settings are
derived from the registrations alone and listed nowhere else. A user registers their own strategy the same way,
with a settings class of their own if it has settings (a frozen dataclass, usually a subclass of the stage's base
in `hf_cluster_select.settings`), before building the config:

    from dataclasses import dataclass
    from hf_cluster_select.registry import WITHIN_CLUSTER_RULES
    from hf_cluster_select.settings import SelectionSettings

    @dataclass(frozen=True)
    class FirstKSettings(SelectionSettings):
        offset: int = 0

    @WITHIN_CLUSTER_RULES.register("first_k", settings=FirstKSettings)
    def first_k(points, keep, rng, norms=None, losses=None, offset=0):
        return np.arange(offset, offset + keep) % points.shape[0], np.full(keep, points.shape[0] / keep)

    ClusterSelectConfig(within_cluster="first_k", strategy_kwargs={"offset": 2})

A within-cluster rule is called with its own settings (the fields its settings class adds to the stage's base) as
keyword arguments; a clusterer reads its own from the config it is handed (`config.cluster_settings`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .settings import AllocationSettings, ClusteringSettings, FeatureSettings, SelectionSettings, TargetSettings

T = TypeVar("T")


class Registry(Generic[T]):
    """Strategies of one kind, by name, each with its settings class.

    Args:
        kind (`str`): the config field that names a strategy (e.g. `"within_cluster"`), for error messages.
        settings (`type`): the stage's base settings class, used for a strategy registered without its own.
        builtins (`str`): module that registers the built-in strategies, imported on first lookup.
    """

    def __init__(self, kind: str, settings: type, builtins: str) -> None:
        self.kind = kind
        self.base_settings = settings
        self._builtins = builtins
        self._loaded = False
        self._entries: dict[str, T] = {}
        self._settings: dict[str, type] = {}

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # set first: the import below registers into this registry
            try:
                importlib.import_module(self._builtins)
            except BaseException:
                self._loaded = False
                raise

    def register(self, name: str, settings: type | None = None) -> Callable[[T], T]:
        """Decorator: `@RULES.register("central")` adds the decorated function or class under `name`.

        Args:
            name (`str`): the name a config gives.
            settings (`type`, *optional*): the strategy's settings dataclass; the stage's base class when `None`.
        Raises:
            ValueError: if `name` is already registered. TypeError: if `settings` is not a dataclass.
        """
        settings = settings or self.base_settings
        if not hasattr(settings, "__dataclass_fields__"):
            raise TypeError(f"`settings` of {self.kind} strategy {name!r} must be a dataclass, got {settings!r}.")

        def add(entry: T) -> T:
            self._load()  # the built-ins first, so a user's name that clashes with one fails here, not later
            if name in self._entries:
                raise ValueError(f"{self.kind} strategy {name!r} is already registered.")
            self._entries[name] = entry
            self._settings[name] = settings
            return entry

        return add

    def get(self, name: str) -> T:
        """The strategy registered under `name`.

        Raises:
            ValueError: if no strategy has that name; the message lists the names there are.
        """
        self._load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"`{self.kind}` must be one of {self.names()}, got {name!r}.") from None

    def settings_class(self, name: str) -> type:
        """The settings dataclass of strategy `name`.

        Raises:
            ValueError: if no strategy has that name.
        """
        self.get(name)
        return self._settings[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        self._load()
        return list(self._entries)

    def __contains__(self, name: Any) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


FEATURES: Registry = Registry("feature", FeatureSettings, "hf_cluster_select.features")
CLUSTERERS: Registry = Registry("cluster_method", ClusteringSettings, "hf_cluster_select.selection")
WITHIN_CLUSTER_RULES: Registry = Registry("within_cluster", SelectionSettings, "hf_cluster_select.selection")
ALLOCATIONS: Registry = Registry("allocation", AllocationSettings, "hf_cluster_select.batching")
TARGET_RULES: Registry = Registry("target_rule", TargetSettings, "hf_cluster_select.selection")
STAGES = {"feature": FEATURES, "cluster_method": CLUSTERERS, "within_cluster": WITHIN_CLUSTER_RULES,
          "allocation": ALLOCATIONS}
