"""Within-cluster selection rules for the linear-probe benchmark (`benchmarks/probe.py`).

Every rule is a pure function with the registry signature

    rule(points, keep, rng, norms=None, losses=None) -> (positions, weights)

- `points` `[n_c, d]`: the cluster's members in the clustering space (L2-normalised features after PCA);
- `keep` in `[1, n_c]`: how many members to keep;
- `rng`: a seeded `np.random.Generator` (the only source of randomness);
- `norms` `[n_c]`: raw feature norms (gradient-norm estimate); `losses` `[n_c]`: warm-up losses (difficulty).

Returns unique int64 positions into `points` (length `keep`) and float64 weights `[keep]`, positive, summing to
`n_c`, so that the kept members stand for the whole cluster. `RULES` maps names to the functions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Rule = Callable[..., tuple[np.ndarray, np.ndarray]]
# Exact facility-location greedy costs O(keep · n_c²); above this, stochastic greedy (Mirzasoleiman et al. 2015).
_EXACT_GREEDY_MAX_WORK = 3e8


def _uniform(positions: np.ndarray, n_c: int) -> tuple[np.ndarray, np.ndarray]:
    positions = np.asarray(positions, dtype=np.int64)
    return positions, np.full(positions.size, n_c / positions.size, dtype=np.float64)


def _centroid_distances(points: np.ndarray) -> np.ndarray:
    return np.linalg.norm(points - points.mean(axis=0), axis=1)


def _pairwise(points: np.ndarray) -> np.ndarray:
    sq = (points * points).sum(axis=1)
    return np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * points @ points.T, 0.0))


def _nearest_counts(points: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """CRAIG weights: how many members have each kept point as their nearest kept point (kept points own
    themselves, so every weight is >= 1 and the weights sum to n_c)."""
    sq = (points * points).sum(axis=1)
    chosen = points[positions]
    d2 = sq[:, None] + sq[positions][None, :] - 2.0 * points @ chosen.T
    owner = np.argmin(d2, axis=1)
    owner[positions] = np.arange(positions.size)
    return np.bincount(owner, minlength=positions.size).astype(np.float64)


def _medoid(points: np.ndarray) -> int:
    """Member with the smallest summed distance to all others (nearest-to-centroid on large clusters)."""
    if points.shape[0] > 4000:
        return int(np.argmin(_centroid_distances(points)))
    return int(np.argmin(_pairwise(points).sum(axis=1)))


def _by_distance(points: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """Positions sorted by distance to the centroid, nearest first; ties broken at random."""
    return np.lexsort((rng.random(points.shape[0]), _centroid_distances(points)))


# --------------------------------------------------------------------------------------------- geometric rules
def peripheral(points, keep, rng, norms=None, losses=None):
    """The `keep` members farthest from the centroid (the product's default, CluSTER's ablation winner)."""
    return _uniform(_by_distance(points, keep, rng)[::-1][:keep], points.shape[0])


def central(points, keep, rng, norms=None, losses=None):
    """The `keep` members nearest to the centroid (prototypes)."""
    return _uniform(_by_distance(points, keep, rng)[:keep], points.shape[0])


def random(points, keep, rng, norms=None, losses=None):
    """A uniform random subset of the cluster."""
    return _uniform(rng.choice(points.shape[0], size=keep, replace=False), points.shape[0])


def central_peripheral(points, keep, rng, norms=None, losses=None):
    """Half nearest to, half farthest from the centroid (the odd one goes to the central half)."""
    order = _by_distance(points, keep, rng)
    n_central = keep - keep // 2
    return _uniform(np.concatenate([order[:n_central], order[::-1][: keep // 2]]), points.shape[0])


def distance_stratified(points, keep, rng, norms=None, losses=None):
    """Members sorted by distance to the centroid, cut into `keep` equal strata, one random member per stratum,
    weighted by its stratum size (systematic sampling over typicality)."""
    order = _by_distance(points, keep, rng)
    strata = np.array_split(order, keep)
    positions = np.array([s[rng.integers(s.size)] for s in strata], dtype=np.int64)
    return positions, np.array([s.size for s in strata], dtype=np.float64)


def regime_aware(points, keep, rng, norms=None, losses=None, threshold: float = 0.4):
    """Sorscher et al. (2022): with a small keep ratio keep the typical (central) members, with a large one the
    boundary (peripheral) ones; the switch is at `keep / n_c >= threshold` (0.4)."""
    if keep / points.shape[0] >= threshold:
        return peripheral(points, keep, rng)
    return central(points, keep, rng)


def kcenter(points, keep, rng, norms=None, losses=None):
    """k-center greedy (Sener & Savarese 2018) from the medoid: repeatedly add the member farthest from the kept."""
    n_c = points.shape[0]
    chosen = [_medoid(points)]
    gap = np.linalg.norm(points - points[chosen[0]], axis=1)
    gap[chosen[0]] = -1.0
    for _ in range(keep - 1):
        nxt = int(np.argmax(gap + 1e-12 * rng.random(n_c)))
        chosen.append(nxt)
        gap = np.minimum(gap, np.linalg.norm(points - points[nxt], axis=1))
        gap[chosen] = -1.0
    return _uniform(np.array(chosen), n_c)


def kcenter_craig(points, keep, rng, norms=None, losses=None):
    """k-center greedy with CRAIG weights (members owned by each kept point)."""
    positions, _ = kcenter(points, keep, rng)
    return positions, _nearest_counts(points, positions)


def _facility_location(points: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy maximiser of F(S) = Σ_i max_{j∈S} sim(i, j), sim = max distance − distance (Mirzasoleiman et al.
    2020); exact greedy on small clusters, stochastic greedy (ε = 0.01) on large ones."""
    n_c = points.shape[0]
    dist = _pairwise(points)
    sim = dist.max() - dist
    best = np.zeros(n_c)
    free = np.ones(n_c, dtype=bool)
    chosen: list[int] = []
    sample = n_c if keep * n_c * n_c <= _EXACT_GREEDY_MAX_WORK else int(np.ceil(n_c / keep * np.log(100)))
    for _ in range(keep):
        candidates = np.flatnonzero(free)
        if sample < candidates.size:
            candidates = rng.choice(candidates, size=sample, replace=False)
        gains = np.maximum(sim[:, candidates] - best[:, None], 0.0).sum(axis=0)
        pick = int(candidates[np.argmax(gains)])
        chosen.append(pick)
        free[pick] = False
        best = np.maximum(best, sim[:, pick])
    return np.array(chosen, dtype=np.int64)


def craig(points, keep, rng, norms=None, losses=None):
    """Facility-location greedy medoids with CRAIG weights (Mirzasoleiman et al. 2020)."""
    positions = _facility_location(points, keep, rng)
    return positions, _nearest_counts(points, positions)


def facility_uniform(points, keep, rng, norms=None, losses=None):
    """Facility-location greedy medoids with uniform weights (CRAIG's selection without its weights)."""
    return _uniform(_facility_location(points, keep, rng), points.shape[0])


def kmeanspp(points, keep, rng, norms=None, losses=None):
    """k-means++ (D²) seeding from a random member, as BADGE samples its gradient embeddings; CRAIG weights."""
    n_c = points.shape[0]
    chosen = [int(rng.integers(n_c))]
    d2 = ((points - points[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(keep - 1):
        d2[chosen] = 0.0
        total = d2.sum()
        if total <= 0:
            rest = np.setdiff1d(np.arange(n_c), chosen)
            nxt = int(rng.choice(rest))
        else:
            nxt = int(rng.choice(n_c, p=d2 / total))
        chosen.append(nxt)
        d2 = np.minimum(d2, ((points - points[nxt]) ** 2).sum(axis=1))
    positions = np.array(chosen, dtype=np.int64)
    return positions, _nearest_counts(points, positions)


# ------------------------------------------------------------------------------------------ learning-signal rules
def drop_hard_random(points, keep, rng, norms=None, losses=None, drop: float = 0.05):
    """CCS-like: drop the hardest `drop` share by warm-up loss (never below `keep` left), then random."""
    n_c = points.shape[0]
    if losses is None:
        return random(points, keep, rng)
    n_drop = min(int(np.ceil(drop * n_c)), n_c - keep)
    order = np.lexsort((rng.random(n_c), -np.asarray(losses, dtype=np.float64)))
    pool = order[n_drop:]
    return _uniform(rng.choice(pool, size=keep, replace=False), n_c)


def loss_stratified(points, keep, rng, norms=None, losses=None, drop: float = 0.05):
    """CCS (Zheng et al. 2023)-like: drop the hardest `drop` share, then one random member per equal-size loss
    stratum, weighted by stratum size (the dropped members' weight is spread over the strata)."""
    n_c = points.shape[0]
    if losses is None:
        return distance_stratified(points, keep, rng)
    n_drop = min(int(np.ceil(drop * n_c)), n_c - keep)
    order = np.lexsort((rng.random(n_c), np.asarray(losses, dtype=np.float64)))[: n_c - n_drop]
    strata = np.array_split(order, keep)
    positions = np.array([s[rng.integers(s.size)] for s in strata], dtype=np.int64)
    weights = np.array([s.size for s in strata], dtype=np.float64)
    return positions, weights * (n_c / weights.sum())


def _importance(points, keep, rng, score, mix: float = 0.5):
    """Sample `keep` members without replacement, p ∝ mix/n + (1 − mix)·score/Σscore; weights 1/(keep·p)
    renormalised to sum to n_c (Katharopoulos & Fleuret 2018)."""
    n_c = points.shape[0]
    score = np.maximum(np.asarray(score, dtype=np.float64), 0.0)
    p = np.full(n_c, 1.0 / n_c) if score.sum() <= 0 else mix / n_c + (1.0 - mix) * score / score.sum()
    p = p / p.sum()
    positions = rng.choice(n_c, size=keep, replace=False, p=p)
    weights = 1.0 / (keep * p[positions])
    return positions.astype(np.int64), weights * (n_c / weights.sum())


def importance_norm(points, keep, rng, norms=None, losses=None):
    """Importance sampling by gradient norm with inverse-probability weights."""
    return _importance(points, keep, rng, np.ones(points.shape[0]) if norms is None else norms)


def importance_loss(points, keep, rng, norms=None, losses=None):
    """Importance sampling by warm-up loss with inverse-probability weights."""
    return _importance(points, keep, rng, np.ones(points.shape[0]) if losses is None else losses)


RULES: dict[str, Rule] = {
    "peripheral": peripheral,
    "central": central,
    "random": random,
    "central_peripheral": central_peripheral,
    "distance_stratified": distance_stratified,
    "regime_aware": regime_aware,
    "kcenter": kcenter,
    "kcenter_craig": kcenter_craig,
    "craig": craig,
    "facility_uniform": facility_uniform,
    "kmeanspp": kmeanspp,
    "drop_hard_random": drop_hard_random,
    "loss_stratified": loss_stratified,
    "importance_norm": importance_norm,
    "importance_loss": importance_loss,
}


def check_output(positions: np.ndarray, weights: np.ndarray, n_c: int, keep: int) -> None:
    """Raise if a rule broke the contract (unique int64 positions of length `keep`, positive weights summing
    to `n_c`)."""
    assert positions.dtype == np.int64 and positions.shape == (keep,), (positions.dtype, positions.shape, keep)
    assert np.unique(positions).size == keep and positions.min() >= 0 and positions.max() < n_c
    assert weights.dtype == np.float64 and weights.shape == (keep,) and (weights > 0).all()
    assert abs(weights.sum() - n_c) <= 1e-6 * max(1, n_c), (weights.sum(), n_c)
