"""A name → strategy table (layer L0: imports nothing from the package).

Each pipeline stage keeps one `Registry` of interchangeable strategies (feature signals, clusterers, within-cluster
rules, allocations). Adding a strategy is one function or class and one `register` line; the names a user may pass
in `ClusterSelectConfig` are the registry's keys (a test checks that the config's choices and the registries agree).
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
