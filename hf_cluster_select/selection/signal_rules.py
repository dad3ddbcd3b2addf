"""Within-cluster rules driven by the learning signal: warm-up loss and gradient norm (layer L2).

Same contract as `within_cluster.py`. Sources: dropping the hardest examples, coverage over difficulty (CCS,
Zheng et al., ICLR 2023); importance sampling with inverse-probability weights, which keeps the weighted gradient
unbiased while lowering its variance (Alain et al. 2015; Katharopoulos & Fleuret, ICML 2018). `norms` are the raw
feature norms (`FeatureOutput.norms`, the gradient-norm estimate), `losses` the warm-up losses
(`FeatureOutput.losses`); without them each rule falls back as its docstring says. Loss outliers within a cluster:
the modified z-score of Iglewicz & Hoaglin (1993), in the spirit of noise-aware selection that skips examples a
warmed model finds unlearnable (RHO-LOSS, Mindermann et al., ICML 2022).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_real
from ..settings import SelectionSettings
from .coverage_rules import distance_stratified, facility_location
from .within_cluster import WITHIN_CLUSTER_RULES, _uniform, random

DROP_HARDEST = 0.05  # share of a cluster dropped as the hardest (likely mislabeled) examples
IMPORTANCE_MIX = 0.5  # sampling probability: this share uniform, the rest in proportion to the score
LOSS_OUTLIER_Z = 1.0  # modified z-score of the warm-up loss above which a member is dropped from its cluster


@dataclass(frozen=True)
class LossOutlierSettings(SelectionSettings):
    """Settings of `within_cluster="drop_loss_outliers"`.

    Attributes:
        loss_outlier_z (`float`, defaults to `1.0`): modified z-score of the warm-up loss within the cluster above
            which a member is dropped (`loss_outlier_scores`); finite, > 0. Larger drops fewer.
    Raises:
        ValueError: if `loss_outlier_z` is not a finite number > 0.
    """

    loss_outlier_z: float = field(default=LOSS_OUTLIER_Z, metadata={
        "help": "drop_loss_outliers: modified z-score of the warm-up loss within a cluster above which a member "
                "is dropped (finite, > 0; larger drops fewer)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "loss_outlier_z", check_real("loss_outlier_z", self.loss_outlier_z,
                                                              lambda v: 0 < v < math.inf, "a finite number > 0"))


def loss_outlier_scores(losses) -> np.ndarray:
    """Modified z-score of every member's warm-up loss within its cluster, `0.6745 · (loss − median) / MAD`
    (Iglewicz & Hoaglin 1993; MAD = median absolute deviation), float64 `[n_c]`; all zeros when MAD = 0.

    Args:
        losses (array-like of shape `[n_c]`): warm-up losses (nats) of one cluster's members.
    """
    losses = np.asarray(losses, dtype=np.float64).reshape(-1)
    median = np.median(losses)
    mad = np.median(np.abs(losses - median))
    return np.zeros_like(losses) if mad <= 0 else 0.6745 * (losses - median) / mad


@WITHIN_CLUSTER_RULES.register("drop_loss_outliers", settings=LossOutlierSettings)
def drop_loss_outliers(points, keep, rng, norms=None, losses=None, loss_outlier_z: float = LOSS_OUTLIER_Z):
    """Noise-aware facility location: drop the members whose warm-up loss is an outlier for their cluster
    (`loss_outlier_scores` > `loss_outlier_z`; never fewer than `keep` left: the least outlying are readmitted first), then
    greedy medoids of the rest, each weighted `n_c / keep` (the dropped members' weight moves to the kept ones, so
    the kept set stands for the cluster's learnable members).

    A mislabeled example is one the warmed model finds hard *for its cluster*: on 20 Newsgroups with 40 % of the
    labels replaced (seed 0), within-cluster scores separate the wrong labels (AUROC 0.74 after a 20-step warm-up,
    0.57 after the default 3 steps) better than the raw loss (0.64 / 0.56). Measured against the default at equal
    steps it ties (+0.2 to +1.0 points on the noisy pool, −0.9 / +0.5 on the clean one), so it is an option, not
    the default (`benchmarks/README.md`, "Noisy and redundant pools"). Without losses (a truncated language-model
    feature pass keeps none) it is `facility_location`.
    """
    n_c = points.shape[0]
    if losses is None:
        return facility_location(points, keep, rng)
    scores = loss_outlier_scores(losses)
    n_left = max(int(keep), int((scores <= loss_outlier_z).sum()))
    left = np.sort(np.lexsort((np.arange(n_c), scores))[:n_left])
    positions, _ = facility_location(points[left], keep, rng)
    return _uniform(left[positions], n_c)




@dataclass(frozen=True)
class DropHardestSettings(SelectionSettings):
    """Settings of `within_cluster="drop_hard_random"` and `"loss_stratified"`.

    Attributes:
        drop_hardest (`float`, defaults to `0.05`): share of each cluster, by highest warm-up loss, left out before
            choosing (never so many that fewer than the cluster's quota are left); in [0, 1). On a pool with a
            known share of wrong labels or replies, that share (the small-loss trick: Han et al., NeurIPS 2018).
    Raises:
        ValueError: if `drop_hardest` is not a number in [0, 1).
    """

    drop_hardest: float = field(default=DROP_HARDEST, metadata={
        "help": "drop_hard_random / loss_stratified: share of each cluster with the highest warm-up loss left out "
                "before choosing, in [0, 1)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "drop_hardest", check_real("drop_hardest", self.drop_hardest,
                                                            lambda v: 0 <= v < 1, "a number in [0, 1)"))


def _hardest_count(drop_hardest: float, n_c: int) -> int:
    """Members to leave out: `drop_hardest · n_c` rounded up after rounding to 6 decimals, so that 0.07 · 100 is 7,
    not 8 (the product is 7.000000000000001 in floating point), and a float32 0.4 of 50 members is 20."""
    return int(math.ceil(round(drop_hardest * n_c, 6)))


@WITHIN_CLUSTER_RULES.register("drop_hard_random", settings=DropHardestSettings)
def drop_hard_random(points, keep, rng, norms=None, losses=None, drop_hardest: float = DROP_HARDEST):
    """CCS-like: drop the hardest `drop_hardest` share by warm-up loss (never below `keep` left), then random."""
    n_c = points.shape[0]
    if losses is None:
        return random(points, keep, rng)
    n_drop = min(_hardest_count(drop_hardest, n_c), n_c - keep)
    order = np.lexsort((rng.random(n_c), -np.asarray(losses, dtype=np.float64)))
    pool = order[n_drop:]
    return _uniform(rng.choice(pool, size=keep, replace=False), n_c)


@WITHIN_CLUSTER_RULES.register("loss_stratified", settings=DropHardestSettings)
def loss_stratified(points, keep, rng, norms=None, losses=None, drop_hardest: float = DROP_HARDEST):
    """CCS (Zheng et al. 2023)-like: drop the hardest `drop_hardest` share, then one random member per equal-size
    loss stratum, weighted by stratum size (the dropped members' weight is spread over the strata)."""
    n_c = points.shape[0]
    if losses is None:
        return distance_stratified(points, keep, rng)
    n_drop = min(_hardest_count(drop_hardest, n_c), n_c - keep)
    order = np.lexsort((rng.random(n_c), np.asarray(losses, dtype=np.float64)))[: n_c - n_drop]
    strata = np.array_split(order, keep)
    positions = np.array([s[rng.integers(s.size)] for s in strata], dtype=np.int64)
    weights = np.array([s.size for s in strata], dtype=np.float64)
    return positions, weights * (n_c / weights.sum())


def _importance(points, keep, rng, score, mix: float = IMPORTANCE_MIX):
    """Sample `keep` members without replacement, p ∝ mix/n + (1 − mix)·score/Σscore; weights 1/(keep·p)
    renormalised to sum to n_c (Katharopoulos & Fleuret 2018)."""
    n_c = points.shape[0]
    score = np.maximum(np.asarray(score, dtype=np.float64), 0.0)
    p = np.full(n_c, 1.0 / n_c) if score.sum() <= 0 else mix / n_c + (1.0 - mix) * score / score.sum()
    p = p / p.sum()
    positions = rng.choice(n_c, size=keep, replace=False, p=p)
    weights = 1.0 / (keep * p[positions])
    return positions.astype(np.int64), weights * (n_c / weights.sum())


@WITHIN_CLUSTER_RULES.register("importance_norm")
def importance_norm(points, keep, rng, norms=None, losses=None):
    """Importance sampling by gradient norm with inverse-probability weights."""
    return _importance(points, keep, rng, np.ones(points.shape[0]) if norms is None else norms)


@WITHIN_CLUSTER_RULES.register("importance_loss")
def importance_loss(points, keep, rng, norms=None, losses=None):
    """Importance sampling by warm-up loss with inverse-probability weights."""
    return _importance(points, keep, rng, np.ones(points.shape[0]) if losses is None else losses)


# Rules that need `losses`: the pipeline warns when a run has none to give them (a truncated feature pass).
for _rule in (drop_loss_outliers, drop_hard_random, loss_stratified, importance_loss):
    _rule.uses_losses = True
