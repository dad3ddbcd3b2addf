"""Seeded pools for the sharded-selection tests (the pytest process and the torchrun workers build the same)."""

from __future__ import annotations

import numpy as np

from hf_cluster_select import ClusterSelectConfig

POOLS = ("plain", "messy")


def mixture(n: int, dim: int, components: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` float32 rows `[n, dim]` of `components` well-separated Gaussian blobs, and each row's blob `[n]`."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(components, dim)) * 4.0
    truth = rng.integers(0, components, size=n)
    return (centres[truth] + rng.normal(size=(n, dim))).astype(np.float32), truth


def pool(name: str) -> dict:
    """`plain`: 3,000 × 8 rows of 12 blobs. `messy`: the same plus 40 exact copies of row 7, 6 rows of NaN, 25
    deferred rows (no loss-bearing token), norms and losses. Both with a fit sample of 500 rows and f = 0.3."""
    features, truth = mixture(3000, 8, 12, seed=5)
    data = {"features": features, "truth": truth,
            "config": ClusterSelectConfig(data_fraction=0.3, strategy_kwargs={"cluster_sample_size": 500})}
    if name == "messy":
        rng = np.random.default_rng(6)
        copies = rng.choice(np.arange(8, 3000), size=40, replace=False)
        features[copies] = features[7]
        others = np.setdiff1d(np.arange(3000), np.append(copies, 7))
        nonfinite, deferred = np.split(rng.choice(others, size=31, replace=False), [6])
        features[nonfinite] = np.nan
        tokens = np.ones(3000, dtype=np.int64)
        tokens[deferred] = 0
        data.update(features=features, loss_tokens=tokens, norms=rng.uniform(0.5, 2.0, 3000),
                    losses=rng.uniform(0.0, 3.0, 3000), copies=np.sort(np.append(copies, 7)),
                    nonfinite=np.sort(nonfinite), deferred=np.sort(deferred))
    return data


def shard_of(n: int, rank: int, world: int) -> np.ndarray:
    """Rank `rank`'s rows: every `world`-th entry of a seeded permutation of `range(n)` (not in dataset order)."""
    return np.random.default_rng(9).permutation(n)[rank::world]
