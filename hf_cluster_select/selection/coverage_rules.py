"""Coverage-keeping within-cluster rules: representatives that spread over the cluster (layer L2).

Same contract as `within_cluster.py`: `rule(points [n_c, d], keep, rng, norms=None, losses=None) -> (positions,
weights)`, weights positive and summing to `n_c`. Sources: k-center greedy (Sener & Savarese, ICLR 2018); facility
location with CRAIG weights (Mirzasoleiman, Bilmes & Leskovec, ICML 2020; stochastic greedy, Mirzasoleiman et al.,
AAAI 2015); k-means++ seeding as BADGE samples (Ash et al., ICLR 2020); typical vs boundary examples by regime
(Sorscher et al., NeurIPS 2022).
"""

from __future__ import annotations

import numpy as np

from .within_cluster import WITHIN_CLUSTER_RULES, _centroid_distances, _uniform, central, peripheral

# Exact facility-location greedy costs O(keep · n_c²); above this, stochastic greedy.
_EXACT_GREEDY_MAX_WORK = 3e8
_PAIRWISE_MAX_POINTS = 4000  # a medoid over more members than this is approximated by the nearest-to-centroid


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
    if points.shape[0] > _PAIRWISE_MAX_POINTS:
        return int(np.argmin(_centroid_distances(points)))
    return int(np.argmin(_pairwise(points).sum(axis=1)))


def _by_distance(points: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """Positions sorted by distance to the centroid, nearest first; ties broken at random."""
    return np.lexsort((rng.random(points.shape[0]), _centroid_distances(points)))


@WITHIN_CLUSTER_RULES.register("central_peripheral")
def central_peripheral(points, keep, rng, norms=None, losses=None):
    """Half nearest to, half farthest from the centroid (the odd one goes to the central half)."""
    order = _by_distance(points, keep, rng)
    n_central = keep - keep // 2
    return _uniform(np.concatenate([order[:n_central], order[::-1][: keep // 2]]), points.shape[0])


@WITHIN_CLUSTER_RULES.register("distance_stratified")
def distance_stratified(points, keep, rng, norms=None, losses=None):
    """Members sorted by distance to the centroid, cut into `keep` equal strata, one random member per stratum,
    weighted by its stratum size (systematic sampling over typicality)."""
    order = _by_distance(points, keep, rng)
    strata = np.array_split(order, keep)
    positions = np.array([s[rng.integers(s.size)] for s in strata], dtype=np.int64)
    return positions, np.array([s.size for s in strata], dtype=np.float64)


@WITHIN_CLUSTER_RULES.register("regime_aware")
def regime_aware(points, keep, rng, norms=None, losses=None, threshold: float = 0.4):
    """Sorscher et al. (2022): with a small keep ratio keep the typical (central) members, with a large one the
    boundary (peripheral) ones; the switch is at `keep / n_c >= threshold` (0.4)."""
    if keep / points.shape[0] >= threshold:
        return peripheral(points, keep, rng)
    return central(points, keep, rng)


@WITHIN_CLUSTER_RULES.register("kcenter")
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


@WITHIN_CLUSTER_RULES.register("kcenter_craig")
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


@WITHIN_CLUSTER_RULES.register("craig")
def craig(points, keep, rng, norms=None, losses=None):
    """Facility-location greedy medoids with CRAIG weights (Mirzasoleiman et al. 2020)."""
    positions = _facility_location(points, keep, rng)
    return positions, _nearest_counts(points, positions)


@WITHIN_CLUSTER_RULES.register("facility_location")
def facility_location(points, keep, rng, norms=None, losses=None):
    """Facility-location greedy medoids (Mirzasoleiman et al., ICML 2020) with uniform weights `n_c / keep`:
    CRAIG's representatives without its weights (the default rule, chosen on `benchmarks/probe.py`)."""
    return _uniform(_facility_location(points, keep, rng), points.shape[0])


@WITHIN_CLUSTER_RULES.register("kmeanspp")
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
