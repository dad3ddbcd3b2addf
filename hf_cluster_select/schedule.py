"""The optimizer-step plan of a ClusterTrainer run, known before training starts (layer L2).

Per-rank batch counts come from `batching.plan.batches_per_rank` (or the allocation, for the subset).

A run is a warm-up phase on the full data (logical epoch 0, when `warmup_steps > 0`) followed by epochs over the
selected subset. The plan fixes every count in advance so the LR schedule spans exactly the steps that will run.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

from .batching.plan import batches_per_rank


@dataclass(frozen=True)
class StepPlan:
    """Every count of a ClusterTrainer run.

    Attributes:
        n_examples (`int`): size of the full training set.
        n_kept (`int`): size of the selected subset (with `budget_unit="tokens"`: the same share of examples, which
            sets the step count; the kept count then varies, see `SelectionRun.adopt`).
        world_size (`int`), per_device_batch_size (`int`), gradient_accumulation_steps (`int`): batch geometry.
        warmup_steps (`int`): optimizer steps on the full data before selection (0 = select first).
        selected_batches_per_epoch (`int`): per-device batches each rank gets per epoch of the subset.
        selected_steps_per_epoch (`int`): optimizer steps per epoch of the subset.
        selected_steps (`int`): optimizer steps after selection, in total.
        selected_epochs (`int`): epochs over the subset (the last one may be cut short by `max_steps`).
        total_steps (`int`): `warmup_steps + selected_steps`; the LR schedule spans exactly this.
        full_data_steps (`int`): steps the same recipe would take on the full data (for the savings estimate).
    """

    n_examples: int
    n_kept: int
    world_size: int
    per_device_batch_size: int
    gradient_accumulation_steps: int
    warmup_steps: int
    selected_batches_per_epoch: int
    selected_steps_per_epoch: int
    selected_steps: int
    selected_epochs: int
    total_steps: int
    full_data_steps: int

    @property
    def warmup_epochs(self) -> int:
        """1 when the run has a warm-up phase (logical epoch 0), else 0."""
        return 1 if self.warmup_steps > 0 else 0

    @property
    def num_epochs(self) -> int:
        """Logical epochs the Trainer loops over: the warm-up epoch plus the subset epochs."""
        return self.warmup_epochs + self.selected_epochs

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step over all ranks: world size × per-device batch × accumulation."""
        return self.world_size * self.per_device_batch_size * self.gradient_accumulation_steps

    def is_warmup_epoch(self, epoch: int) -> bool:
        """Whether logical epoch `epoch` is the warm-up phase."""
        return self.warmup_steps > 0 and epoch == 0

    def epoch_lengths(self, epoch: int) -> tuple[int, int]:
        """(per-device batches, optimizer steps) of logical epoch `epoch`."""
        if self.is_warmup_epoch(epoch):
            return self.warmup_steps * self.gradient_accumulation_steps, self.warmup_steps
        return self.selected_batches_per_epoch, self.selected_steps_per_epoch

    def locate(self, global_step: int) -> tuple[int, int]:
        """Where a run resumed at `global_step` continues.

        Returns:
            `(epoch, batches_to_skip)`: the logical epoch and the per-device batches of it already trained.
        Raises:
            ValueError: if `global_step` is negative or beyond `total_steps`.
        """
        if not 0 <= global_step <= self.total_steps:
            raise ValueError(f"`global_step` must be in [0, {self.total_steps}], got {global_step}.")
        if global_step < self.warmup_steps:
            return 0, global_step * self.gradient_accumulation_steps
        done = global_step - self.warmup_steps
        epoch = self.warmup_epochs + done // self.selected_steps_per_epoch
        return epoch, (done % self.selected_steps_per_epoch) * self.gradient_accumulation_steps

    def to_dict(self) -> dict:
        """Plain dictionary of every field."""
        return asdict(self)


def plan_steps(
    *,
    n_examples: int,
    n_kept: int,
    world_size: int,
    per_device_batch_size: int,
    gradient_accumulation_steps: int,
    warmup_steps: int,
    num_train_epochs: float,
    max_steps: int = -1,
    selected_batches_per_epoch: int | None = None,
) -> StepPlan:
    """Plan every optimizer step of a run before it starts.

    With `max_steps > 0` the run does exactly `max_steps` steps (warm-up included); otherwise it does the warm-up
    plus `ceil(num_train_epochs × steps per subset epoch)` steps, i.e. `num_train_epochs` counts epochs over the
    selected subset, as a user of `Trainer` would expect.

    Args:
        n_examples (`int`): size of the full training set (>= 1).
        n_kept (`int`): size of the selected subset, in `[1, n_examples]`.
        world_size (`int`): number of data-parallel ranks (>= 1).
        per_device_batch_size (`int`): examples per per-device batch (>= 1).
        gradient_accumulation_steps (`int`): micro-batches per optimizer step (>= 1).
        warmup_steps (`int`): optimizer steps on the full data before selection (>= 0).
        num_train_epochs (`float`): epochs over the subset (> 0), used when `max_steps <= 0`.
        max_steps (`int`, *optional*, defaults to `-1`): total optimizer steps including the warm-up.
        selected_batches_per_epoch (`int`, *optional*): per-device batches each rank gets per epoch of the subset,
            when the batch plan knows it better than `ceil(n_kept / (world_size · per_device_batch_size))` (CluSTER's
            one-cluster-per-rank allocation: `ceil(largest kept cluster / per_device_batch_size)`); >= 1.
    Returns:
        `StepPlan`.
    Raises:
        ValueError: if a count is out of range, the dataset or subset is smaller than one global batch, or
            `warmup_steps` leaves no step for the selected data.
    """
    _check_counts(n_examples, n_kept, world_size, per_device_batch_size, gradient_accumulation_steps, warmup_steps)
    batches = batches_per_rank(n_kept, world_size, per_device_batch_size)
    if selected_batches_per_epoch is not None:
        if selected_batches_per_epoch < 1:
            raise ValueError(f"`selected_batches_per_epoch` must be >= 1, got {selected_batches_per_epoch}.")
        batches = int(selected_batches_per_epoch)
    steps_per_epoch = math.ceil(batches / gradient_accumulation_steps)
    full_steps_per_epoch = math.ceil(
        batches_per_rank(n_examples, world_size, per_device_batch_size) / gradient_accumulation_steps
    )
    selected, full_data_steps = _step_totals(steps_per_epoch, full_steps_per_epoch, warmup_steps, num_train_epochs,
                                             max_steps)
    return StepPlan(
        n_examples=n_examples,
        n_kept=n_kept,
        world_size=world_size,
        per_device_batch_size=per_device_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        warmup_steps=warmup_steps,
        selected_batches_per_epoch=batches,
        selected_steps_per_epoch=steps_per_epoch,
        selected_steps=selected,
        selected_epochs=math.ceil(selected / steps_per_epoch),
        total_steps=warmup_steps + selected,
        full_data_steps=full_data_steps,
    )


def _check_counts(n_examples: int, n_kept: int, world_size: int, per_device_batch_size: int,
                  gradient_accumulation_steps: int, warmup_steps: int) -> None:
    """Raise `ValueError` for a count of `plan_steps` out of range, or a dataset or subset smaller than one global
    batch."""
    for name, value, minimum in (
        ("n_examples", n_examples, 1),
        ("world_size", world_size, 1),
        ("per_device_batch_size", per_device_batch_size, 1),
        ("gradient_accumulation_steps", gradient_accumulation_steps, 1),
        ("warmup_steps", warmup_steps, 0),
    ):
        if value < minimum:
            raise ValueError(f"`{name}` must be >= {minimum}, got {value}.")
    if not 1 <= n_kept <= n_examples:
        raise ValueError(f"`n_kept` must be in [1, n_examples={n_examples}], got {n_kept}.")
    global_batch = world_size * per_device_batch_size * gradient_accumulation_steps
    one_batch = (f"one global batch of {global_batch} (world_size {world_size} × per_device_train_batch_size "
                 f"{per_device_batch_size} × gradient_accumulation_steps {gradient_accumulation_steps})")
    if n_examples < global_batch:
        raise ValueError(f"the training dataset has {n_examples} examples, fewer than {one_batch}; use a smaller "
                         "batch or more data.")
    if n_kept < global_batch:
        raise ValueError(f"the selected subset would hold {n_kept} examples, fewer than {one_batch}; raise "
                         "`data_fraction` or lower the batch.")


def _step_totals(steps_per_epoch: int, full_steps_per_epoch: int, warmup_steps: int, num_train_epochs: float,
                 max_steps: int | None) -> tuple[int, int]:
    """`(selected_steps, full_data_steps)` of `plan_steps`: `max_steps` (warm-up included) when > 0, else
    `num_train_epochs` epochs of each; raises `ValueError` when the warm-up leaves no step for the selected data."""
    lower = ("lower the warm-up (ClusterSelectConfig.selection_warmup_steps, or TrainingArguments.warmup_steps when "
             "that is None)")
    if max_steps is not None and max_steps > 0:
        if warmup_steps >= max_steps:
            raise ValueError(f"`warmup_steps` ({warmup_steps}) must be smaller than the planned total of {max_steps} "
                             f"steps (`max_steps`); {lower} or raise `max_steps`.")
        return max_steps - warmup_steps, max_steps
    if not num_train_epochs > 0:
        raise ValueError(f"`num_train_epochs` must be > 0 when `max_steps` <= 0, got {num_train_epochs}.")
    selected = math.ceil(num_train_epochs * steps_per_epoch)
    full_data_steps = math.ceil(num_train_epochs * full_steps_per_epoch)
    if warmup_steps >= full_data_steps:
        raise ValueError(f"`warmup_steps` ({warmup_steps}) must be smaller than the {full_data_steps} steps the run "
                         f"would take on the full data ({num_train_epochs} epochs); {lower}.")
    return selected, full_data_steps


def resolve_warmup_steps(lr_warmup: float, *, max_steps: int = -1, total_without_warmup: int | None = None) -> int:
    """Warm-up steps on the full data when `ClusterSelectConfig.selection_warmup_steps` is None: the LR warm-up of
    `TrainingArguments.warmup_steps` (an int >= 1 is a step count; a float in (0, 1) a ratio of the total steps).

    A ratio applies to a total that includes the warm-up itself, so with epochs the smallest fixed point
    `w = ceil(ratio · (w + total_without_warmup))` is used; with `max_steps > 0` it is `ceil(ratio · max_steps)`.

    Args:
        lr_warmup (`float`): `TrainingArguments.warmup_steps`.
        max_steps (`int`, *optional*, defaults to `-1`): `TrainingArguments.max_steps`.
        total_without_warmup (`int`, *optional*): planned steps with no warm-up (needed for a ratio without max_steps).
    Returns:
        `int` >= 0.
    Raises:
        ValueError: if a ratio is given with neither `max_steps > 0` nor `total_without_warmup`.
    """
    if lr_warmup >= 1 or lr_warmup <= 0:
        return int(max(lr_warmup, 0))
    if max_steps is not None and max_steps > 0:
        return math.ceil(lr_warmup * max_steps)
    if total_without_warmup is None:
        raise ValueError("`total_without_warmup` is needed to resolve a warm-up ratio without `max_steps`.")
    warmup = 0
    for _ in range(100):
        new = math.ceil(lr_warmup * (warmup + total_without_warmup))
        if new == warmup:
            break
        warmup = new
    return warmup


def warn_if_subset_unseen(plan: StepPlan, budget_unit: str) -> None:
    """Warn when `max_steps` ends training before one pass over the kept set: the feature pass and clustering then
    pay for examples that are never trained on (a smaller `data_fraction` would select for the steps there are).
    `budget_unit` is `ClusterSelectConfig.budget_unit`; `SelectionRun` calls it (`stacklevel` names its caller)."""
    if plan.selected_steps_per_epoch and plan.selected_steps < plan.selected_steps_per_epoch:
        seen = min(plan.n_kept, plan.selected_steps * plan.global_batch_size)
        warnings.warn(
            f"max_steps leaves {plan.selected_steps} optimizer steps after the warm-up, fewer than one pass over the "
            f"{plan.n_kept} {'planned' if budget_unit == 'tokens' else 'kept'} examples "
            f"({plan.selected_steps_per_epoch} steps): about {seen} of them will be "
            f"trained on, yet features are computed for all {plan.n_examples}. Lower data_fraction (to about "
            f"{max(seen, 1) / plan.n_examples:.3g}) or raise max_steps.", UserWarning, stacklevel=3)
