"""Wall-clock seconds of the phases of a selection run (layer L0: standard library only)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

PHASES = ("warmup", "features", "near_duplicates", "clustering", "training")


class PhaseClock:
    """Accumulated `time.perf_counter` seconds per phase, restorable on resume.

    Phases (`PHASES`): `warmup` (optimizer steps on the full data), `features`, `near_duplicates` (the token
    near-duplicate check, when `near_duplicate_threshold` is set), `clustering` (clustering and choosing the subset),
    `training` (optimizer steps on the subset).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._started: dict[str, float] = {}

    def start(self, phase: str) -> None:
        """Start (or continue) the clock of `phase`.

        Raises:
            ValueError: if `phase` is not one of `PHASES`.
        """
        if phase not in PHASES:
            raise ValueError(f"`phase` must be one of {PHASES}, got {phase!r}.")
        self._started[phase] = time.perf_counter()

    def stop(self, phase: str) -> float:
        """Stop the clock of `phase`; returns its accumulated seconds."""
        began = self._started.pop(phase, None)
        if began is not None:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - began
        return self.seconds.get(phase, 0.0)

    def measured(self, phase: str) -> float | None:
        """Seconds measured for `phase` so far (a running clock included), `None` if it never ran."""
        running = self._started.get(phase)
        if running is None:
            return self.seconds.get(phase)
        return self.seconds.get(phase, 0.0) + time.perf_counter() - running

    def snapshot(self) -> dict[str, float]:
        """Seconds measured so far for every phase that ran."""
        return {phase: self.measured(phase) for phase in PHASES if self.measured(phase) is not None}

    def restore(self, seconds: dict[str, float]) -> None:
        """Continue from the seconds a checkpoint recorded (on resume)."""
        self.seconds = {phase: float(value) for phase, value in seconds.items() if phase in PHASES}


@contextlib.contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the wall-clock (`time.perf_counter`) seconds of the `with` block to `seconds[stage]`, also when it
    raises: the per-stage timing of one selection (`ClusteringResult.params["stage_seconds"]`,
    `Selection.stage_seconds`)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - began
