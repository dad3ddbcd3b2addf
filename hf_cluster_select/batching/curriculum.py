"""Curriculum order of the batch plan: each cluster's members from easy to hard (layer L2: numpy only).

`ClusterSelectConfig(order="easy_to_hard")` orders every cluster's kept members by increasing *difficulty* instead
of shuffling them; `plan.mixed_order` then merges the clusters exactly as for a shuffled order (earliest deadline
first over quota windows), so every micro-step keeps the cluster mix while the epoch runs from easy to hard, and
every epoch runs easy → hard again (ties are broken by the epoch's seeded shuffle). Curriculum learning (Bengio,
Louradour, Collobert, Weston, ICML 2009), with the model's own loss as the difficulty, as in self-paced learning
(Kumar, Packer, Koller, NeurIPS 2010).

Difficulty = the per-example loss of the feature pass (mean cross-entropy over the loss-bearing tokens, nats;
`FeatureOutput.losses`), measured after the selection warm-up (with `selection_warmup_steps=0`: the initial
model's). When the feature pass runs only the first blocks (the default LM feature: 2/3 of them), it is the loss of
the model's head applied after those blocks (a "logit lens" loss): a proxy of the full model's loss, used for the
order only (the loss-based within-cluster rules do not take it). An example without loss-bearing tokens has
difficulty 0; a non-finite one sorts last.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SHUFFLED, EASY_TO_HARD = "shuffled", "easy_to_hard"  # `ClusterSelectConfig.order` (config.BATCH_ORDERS)
NO_LOSS = ("no per-example loss for the kept examples (the feature signal returned none, or the selection was "
           "saved without it by an older version)")


def check_difficulty(difficulty: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """`difficulty` as a float64 array of `shape`, or `None`.

    Args:
        difficulty (array-like of shape `shape`, float, or `None`): difficulty of each position (loss, nats).
        shape (`tuple[int, ...]`): the shape of the plan's `labels`, `[m]`.
    Returns:
        `np.ndarray` of shape `shape`, float64 (NaN allowed: sorts last), or `None`.
    Raises:
        ValueError: if it is not a real-valued array of `shape`.
    """
    if difficulty is None:
        return None
    values = np.asarray(difficulty)
    if values.shape != shape or not np.issubdtype(values.dtype, np.number) or np.iscomplexobj(values):
        raise ValueError(f"`difficulty` must be a float array of the shape of `labels` {shape}, got shape "
                         f"{values.shape}, dtype {values.dtype}.")
    return values.astype(np.float64)


def easy_to_hard(members: np.ndarray, difficulty: np.ndarray) -> np.ndarray:
    """`members` (positions, already in a seeded random order) sorted by increasing `difficulty[members]`; a stable
    sort, so ties keep the random order. NaN sorts last.

    Args:
        members (`np.ndarray` of shape `[n_c]`, int): one cluster's positions, shuffled.
        difficulty (`np.ndarray` of shape `[m]`, float): difficulty of every position.
    Returns:
        `np.ndarray` of shape `[n_c]`, int: the same positions, easiest first.
    """
    return members[np.argsort(difficulty[members], kind="stable")]


def resolve_difficulty(order: str, difficulty: Any) -> tuple[np.ndarray | None, str, str | None]:
    """What the subset's plan follows for `ClusterSelectConfig.order`: `(difficulty or None, order used, fallback)`.

    Args:
        order (`str`): `"shuffled"` or `"easy_to_hard"`.
        difficulty (array-like of shape `[m]`, float, or `None`): the kept examples' losses, when measured.
    Returns:
        `tuple`: the difficulty to hand to the plan (`None` = shuffled), the order used (`"shuffled"` or
        `"easy_to_hard"`), and why `"easy_to_hard"` fell back to `"shuffled"` (`None` when it did not).
    Raises:
        ValueError: for an unknown `order`.
    """
    if order not in (SHUFFLED, EASY_TO_HARD):
        raise ValueError(f"`order` must be one of {[SHUFFLED, EASY_TO_HARD]}, got {order!r}.")
    if order == SHUFFLED:
        return None, SHUFFLED, None
    if difficulty is None:
        return None, SHUFFLED, f"order='easy_to_hard' fell back to 'shuffled': {NO_LOSS}"
    return np.asarray(difficulty, dtype=np.float64), EASY_TO_HARD, None
