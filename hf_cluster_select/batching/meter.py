"""Measured token balance across ranks during training (layer L2; exchanges numbers through `distributed`).

Every rank counts the padded tokens (`input_ids.numel()`: examples × longest sequence of the batch) of each
micro-batch it trains; at the end of each optimizer step the ranks exchange their step totals in one tiny
all-gather. The step's slowest rank sets its pace (the gradient all-reduce waits for it), so `max / mean` over ranks
is the time the step takes relative to a perfectly balanced one: 1.0 = no rank waits.
"""

from __future__ import annotations

from .. import distributed

METRIC_PREFIX = "cluster_select/"


class TokenBalanceMeter:
    """Per-step padded tokens of every rank, averaged over a logging interval.

    Use: `add(tokens)` for every trained micro-batch, `end_step()` once per optimizer step on **every** rank (it is a
    collective), `pop_metrics()` when logging.

    Metrics (`cluster_select/` prefix, means over the optimizer steps since the last `pop_metrics`):
    `max_tokens_per_rank` (padded tokens of the busiest rank in a step), `mean_tokens_per_rank` (average over ranks),
    `max_over_mean_tokens` (mean over steps of busiest / average; 1.0 = perfectly balanced).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything counted (the current step's tokens and the interval's steps)."""
        self._step_tokens = 0
        self._steps = 0
        self._sum_max = 0.0
        self._sum_mean = 0.0
        self._sum_ratio = 0.0

    def add(self, tokens: int) -> None:
        """Count one trained micro-batch.

        Args:
            tokens (`int`): padded tokens of the micro-batch on this rank (>= 0), e.g. `input_ids.numel()`.
        Raises:
            ValueError: if `tokens` is negative.
        """
        if tokens < 0:
            raise ValueError(f"`tokens` must be >= 0, got {tokens}.")
        self._step_tokens += int(tokens)

    def end_step(self) -> tuple[float, float]:
        """Close the optimizer step: all-gather every rank's step total (collective: call on every rank).

        Returns:
            `(max_tokens, mean_tokens)` over ranks for this step (padded tokens).
        """
        per_rank = distributed.gather_floats([self._step_tokens])[:, 0]
        self._step_tokens = 0
        busiest, average = float(per_rank.max()), float(per_rank.mean())
        self._steps += 1
        self._sum_max += busiest
        self._sum_mean += average
        self._sum_ratio += busiest / average if average > 0 else 1.0
        return busiest, average

    @property
    def steps(self) -> int:
        """Optimizer steps closed since the last `pop_metrics`."""
        return self._steps

    def pop_metrics(self) -> dict[str, float]:
        """Means over the steps closed since the last call, then start a new interval.

        Returns:
            `dict[str, float]` with the three metrics of the class docstring; empty when no step was closed.
        """
        if self._steps == 0:
            return {}
        steps = self._steps
        metrics = {
            f"{METRIC_PREFIX}max_tokens_per_rank": self._sum_max / steps,
            f"{METRIC_PREFIX}mean_tokens_per_rank": self._sum_mean / steps,
            f"{METRIC_PREFIX}max_over_mean_tokens": self._sum_ratio / steps,
        }
        pending = self._step_tokens
        self.reset()
        self._step_tokens = pending
        return metrics
