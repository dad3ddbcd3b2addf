"""Wall-clock time saved by a selection against full-data training (layer L2: the standard library only)."""

from __future__ import annotations

import math
from typing import Any

MEASURED = "measured"


def estimate_savings(
    *,
    warmup_seconds: float,
    warmup_steps: int,
    selected_steps: int,
    full_data_steps: int,
    selection_seconds: float,
    training_seconds: float,
    measured_full_seconds: float | None = None,
    length_ratio: float | None = None,
) -> dict[str, Any]:
    """Wall-clock time saved by selection against full-data training with the same recipe.

    The full-data time is `measured_full_seconds` when the caller ran it, otherwise it is estimated from this run's
    measured throughput: (warm-up seconds + post-selection training seconds × `length_ratio`) / (warm-up steps +
    selected steps) × the number of steps full-data training would take. `length_ratio` = padded tokens of a
    full-data step (the stock sampler's random batches) / of a selected step (this run's batch plan), or mean input
    tokens per example of the full data / of the kept set: a step's cost scales with its padded tokens (a selection
    of long examples has slower steps than full-data training would; random batches pad more). Averaging over every optimizer step of the run keeps the estimate
    stable (a few warm-up steps alone, first-step overhead included, swung it by tens of percent); the steps of the
    subset may be longer or shorter than average, and token-balanced batches pad less than the stock sampler, so a
    measured full-data run (`measured_full_seconds`) is the reference when it matters.

    Args:
        warmup_seconds (`float`): measured wall-clock seconds of the warm-up steps on the full data (0 if none).
        warmup_steps (`int`): optimizer steps of the warm-up.
        selected_steps (`int`): optimizer steps of training on the selected subset.
        full_data_steps (`int`): optimizer steps the same recipe (epochs, batch geometry) takes on the full data.
        selection_seconds (`float`): measured seconds of feature extraction + clustering + choosing.
        training_seconds (`float`): measured seconds of post-selection training.
        measured_full_seconds (`float`, *optional*): measured seconds of a full-data run, if one was made.
        length_ratio (`float`, *optional*): cost of a full-data step / of a selected step (> 0; see above);
            `None` = 1.
    Returns:
        `dict` with `seconds_per_step` (`float` or `None`), `full_data_seconds`, `full_data_seconds_basis` (`"measured"`
        or `"estimated from this run's measured throughput (X s/step over M optimizer steps × N full-data steps)"`),
        `our_seconds`
        (warm-up + selection + training), `seconds_saved` (full − ours; negative when selection cost more than it
        saved) and `fraction_saved` (saved / full).
    Raises:
        ValueError: if an argument is negative or not finite, or no full-data time can be measured or estimated.
    """
    numbers = dict(
        warmup_seconds=warmup_seconds, warmup_steps=warmup_steps, selected_steps=selected_steps,
        full_data_steps=full_data_steps, selection_seconds=selection_seconds, training_seconds=training_seconds,
    )
    if measured_full_seconds is not None:
        numbers["measured_full_seconds"] = measured_full_seconds
    for name, value in numbers.items():
        if value is None or not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    if length_ratio is not None and not (math.isfinite(float(length_ratio)) and float(length_ratio) > 0):
        raise ValueError(f"`length_ratio` must be a finite number > 0, got {length_ratio!r}.")
    ratio = 1.0 if length_ratio is None else float(length_ratio)
    steps = int(warmup_steps) + int(selected_steps)
    seconds_per_step = (float(warmup_seconds) + float(training_seconds) * ratio) / steps if steps else None
    if measured_full_seconds is not None:
        full, basis = float(measured_full_seconds), MEASURED
    elif seconds_per_step is not None:
        full = seconds_per_step * full_data_steps
        basis = (
            f"estimated from this run's measured throughput ({seconds_per_step:.4g} s/step over {steps:,} optimizer "
            f"steps × {int(full_data_steps):,} full-data steps"
            + (f"; selected steps scaled by {ratio:.3g}, the padded tokens of a full-data step over a selected step's)"
               if length_ratio is not None else ")")
        )
    else:
        raise ValueError("Cannot estimate the full-data time: `warmup_steps` and `selected_steps` are both 0.")
    if full <= 0:
        raise ValueError(f"The full-data time must be > 0 seconds, got {full} ({basis}).")
    ours = float(warmup_seconds) + float(selection_seconds) + float(training_seconds)
    saved = full - ours
    return dict(
        seconds_per_step=seconds_per_step, full_data_seconds=full, full_data_seconds_basis=basis,
        our_seconds=ours, seconds_saved=saved, fraction_saved=saved / full,
    )
