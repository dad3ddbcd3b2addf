"""Near-duplicate feature rows, merged with a tolerance relative to each row's norm (layer L2).

Exact duplicates make HDBSCAN's density estimates infinite, and rows that differ only by rounding (the same example
in batches of other padding, or data repeated with jitter) should count as one point of larger weight. Two rows are
merged when their directions `x / ||x||` agree to about `DUPLICATE_TOLERANCE` in every coordinate, whatever their
scale: each direction is snapped to two grids of step `DUPLICATE_TOLERANCE`, the second shifted by half a step, and
rows that share a cell in either grid are joined (connected components, so a pile of near-identical rows becomes
one group even where a grid boundary runs through it). A row's cell is identified by two seeded 64-bit linear
hashes of its grid coordinates. Groups are numbered in order of their first row, so the result does not depend on
hash values or process.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

DUPLICATE_TOLERANCE = 1e-5  # grid step on unit directions (float32 rounding of a feature pass is ~1e-7 relative)
_MULTIPLIERS_SEED = 20261201


def _multipliers(dim: int) -> np.ndarray:
    rng = np.random.default_rng(_MULTIPLIERS_SEED)
    return rng.integers(1, np.iinfo(np.int64).max, size=(dim, 2), dtype=np.int64) | 1


def cell_codes(unit_rows: np.ndarray, tolerance: float = DUPLICATE_TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """Grid cells of unit-norm rows in the plain and the half-step-shifted grid.

    Args:
        unit_rows (`np.ndarray` of shape `[n, dim]`): L2-normalised rows (zero rows allowed).
        tolerance (`float`, *optional*): grid step.
    Returns:
        `(codes_plain, codes_shifted)`, each `np.ndarray` of shape `[n, 2]`, int64: two hashes per row and grid.
    """
    rows = np.asarray(unit_rows, dtype=np.float64)
    multipliers = _multipliers(rows.shape[1])
    codes = []
    for offset in (0.0, 0.5):
        cells = np.floor(rows / tolerance + offset).astype(np.int64)
        with np.errstate(over="ignore"):
            codes.append(cells @ multipliers)  # wraps modulo 2^64: a hash, not arithmetic
    return codes[0], codes[1]


def duplicate_groups(code_blocks: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join rows that share a cell in either grid (`cell_codes` of consecutive blocks of rows).

    Args:
        code_blocks (iterable of `(codes_plain, codes_shifted)`): `cell_codes` of row blocks, in row order.
    Returns:
        `(inverse [n] int64, first [n_groups] int64, counts [n_groups] int64)`: each row's group, the first row of
        each group and its size; groups numbered by their first row.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    plain, shifted = (np.concatenate(part) for part in zip(*code_blocks))
    n = plain.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    _, cell_a = np.unique(plain, axis=0, return_inverse=True)
    _, cell_b = np.unique(shifted, axis=0, return_inverse=True)
    cell_a, cell_b = cell_a.reshape(-1), cell_b.reshape(-1)
    n_a = int(cell_a.max()) + 1
    size = n + n_a + int(cell_b.max()) + 1
    rows = np.concatenate([np.arange(n), np.arange(n)])
    cols = np.concatenate([n + cell_a, n + n_a + cell_b])
    graph = coo_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(size, size))
    _, component = connected_components(graph, directed=False)
    return groups_by_first_row(component[:n])


def groups_by_first_row(component: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(inverse [n], first [n_groups], counts [n_groups])`, int64, of a partition given as any id per row, its
    groups numbered in order of their first (lowest-index) row (also `near_duplicates.near_duplicate_groups`')."""
    _, first, inverse, counts = np.unique(component, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.reshape(-1)].astype(np.int64), first[order].astype(np.int64), counts[order].astype(np.int64)
