"""A name → strategy table (layer L0: imports nothing from the package).

Each pipeline stage has one `Registry` of interchangeable strategies, defined here (empty) so that
`ClusterSelectConfig` can check a name against it: `FEATURES` (`feature`), `CLUSTERERS` (`cluster_method`),
`WITHIN_CLUSTER_RULES` (`within_cluster`) and `ALLOCATIONS` (`allocation`). The stage modules register the built-in
strategies (`features/`, `selection/`, `batching/`); a user registers their own the same way, before building the
config:

    from hf_cluster_select.registry import WITHIN_CLUSTER_RULES

    @WITHIN_CLUSTER_RULES.register("first_k")
    def first_k(points, keep, rng, norms=None, losses=None):
        return np.arange(keep), np.full(keep, points.shape[0] / keep)

    ClusterSelectConfig(within_cluster="first_k")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Strategies of one kind, by name.

    Args:
        kind (`str`): what the strategies are, for error messages (e.g. `"within_cluster"`, the config field).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@RULES.register("central")` adds the decorated function or class under `name`.

        Raises:
            ValueError: if `name` is already registered.
        """

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} strategy {name!r} is already registered.")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        """The strategy registered under `name`.

        Raises:
            ValueError: if no strategy has that name; the message lists the names there are.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"`{self.kind}` must be one of {self.names()}, got {name!r}.") from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


FEATURES: Registry = Registry("feature")
CLUSTERERS: Registry = Registry("cluster_method")
WITHIN_CLUSTER_RULES: Registry = Registry("within_cluster")
ALLOCATIONS: Registry = Registry("allocation")
