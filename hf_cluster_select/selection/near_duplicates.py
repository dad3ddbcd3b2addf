"""Near-duplicate examples by their tokens: MinHash signatures, LSH banding, verified pairs (layer L2: numpy and scipy).

`duplicates.py` merges rows whose *features* agree to about 1e-5; an example repeated with a few tokens changed has
other features and stays a separate candidate, so a fine-KMeans stratum made of one source's near copies spends its
quota on copies. `near_duplicate_groups` finds such copies from the token ids alone, as near-duplicate removal does
for language-model training data (Lee et al., "Deduplicating Training Data Makes Language Models Better", ACL 2022;
SemDeDup, Abbas et al., arXiv 2303.09540, does it in embedding space):

1. *Shingles*: an example's set of contiguous `shingle`-grams of token ids (3-grams by default); an example shorter
   than `shingle` is one shingle, its whole sequence (so all empty examples are copies of each other).
2. *MinHash* (Broder, "On the resemblance and containment of documents", 1997): per example, the minimum of each of
   `n_hashes` seeded hash functions over its shingles. Two examples agree on a hash with probability equal to the
   Jaccard similarity of their shingle sets, so the fraction of agreeing values estimates it (standard deviation
   √(J(1 − J) / n_hashes): 0.057 at J = 0.7 with 64 hashes). Each shingle is hashed once (a polynomial of its
   tokens and length, then the splitmix64 finaliser, whose top 32 bits are its key x); hash function i is the
   multiply-shift ((a_i · x + b_i) mod 2^64) >> 32 with seeded 64-bit a_i (odd) and b_i, a 2-independent family
   (Dietzfelbinger, STACS 1996), so a signature holds 32-bit values.
3. *LSH banding* (Indyk & Motwani, STOC 1998): the signature is cut into `bands` bands of `rows` values; examples
   that agree on a whole band are candidates. A pair at Jaccard s becomes a candidate with probability
   1 − (1 − s^rows)^bands; `lsh_bands` takes the most rows per band (fewest chance candidates) for which that is
   at least `RECALL_AT_THRESHOLD` = 0.99 at s = threshold (threshold 0.7, 64 hashes: 21 bands of 3 rows,
   probability 0.9998; 0.9: 9 bands of 7, 0.997; 1.0: 1 band of 64). Within a band's bucket each member is paired
   with the bucket's first row and with the next row of the bucket, not with every other member (linear, not
   quadratic, in a bucket of many copies); the other pairs join through those links or through other bands.
4. *Verification*: a candidate pair is kept when its estimated Jaccard (agreeing values / `n_hashes`) is at least
   `threshold`; near the threshold the estimate's noise decides.
5. *Template shingles*: a shingle found in more than `COMMON_SHARE` (half) of the rows is ignored, so a long
   shared prompt (a chat template's system prompt, an instruction repeated on every row) does not make distinct
   examples look alike; the share is estimated on a seeded sample of at most `COMMON_SAMPLE` rows. A row made only
   of such shingles keeps all of them (rows that are nothing but the template are still copies of each other).
   The price: in a pool of at least `COMMON_MIN_ROWS` rows where one example's copies fill more than half the rows,
   their shingles look like template too; its exact copies still join, its near copies may not.
6. *Groups*: connected components of the kept pairs (`scipy.sparse.csgraph`): a chain of near copies is one group,
   even where its two ends are not near copies of each other.

Measured (`near_duplicate_groups` alone): 100,000 rows of 100 token ids (vocabulary 32,000; 20,000 of them near
copies of others, 2 tokens changed: all 20,000 joined to their source, 80,000 groups), threshold 0.7, 64 hashes,
one CPU thread, on a 2-core machine shared with a running benchmark: 1.4–2.0 s with rows as numpy arrays (as
`data.token_rows` reads a `datasets.Dataset`, itself about 0.03 s), 2.2–3.3 s with rows as Python lists (4 runs
each), before the template step. With it, 100,000 random rows of 100 token ids as numpy arrays took 2.2–3.5 s, of
which 0.33 s finding the template shingles on the 10,000-row sample (2 runs, one thread, the other core busy with
a test suite).

`union_groups` joins this partition with the feature-space one (`ClusteringResult.groups`); the pipeline
(`pipeline.select_with_model`) does so when `SelectionSettings.near_duplicate_threshold` is set.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..config import ClusterSelectConfig
from .duplicates import groups_by_first_row

SHINGLE = 3  # tokens per shingle
N_HASHES = 64  # MinHash values per example
RECALL_AT_THRESHOLD = 0.99  # least probability that a pair at exactly the threshold becomes an LSH candidate
COMMON_SHARE = 0.5  # a shingle in more than this share of the rows is template, not content
COMMON_SAMPLE = 10_000  # rows sampled to find the template shingles
COMMON_MIN_ROWS = 20  # fewer non-empty rows: no shingle is treated as template
CHUNK_VALUES = 1 << 22  # shingles × hashes per block of the signature pass, and pairs × hashes when verifying
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of uint64 `values` (a bijection that spreads every input bit), in place."""
    values ^= values >> np.uint64(30)
    values *= _M1
    values ^= values >> np.uint64(27)
    values *= _M2
    values ^= values >> np.uint64(31)
    return values


def lsh_bands(threshold: float, n_hashes: int = N_HASHES) -> tuple[int, int]:
    """`(bands, rows)`: the most rows per band (b = n_hashes // rows bands) for which a pair at Jaccard `threshold`
    becomes a candidate with probability 1 − (1 − threshold^rows)^bands >= `RECALL_AT_THRESHOLD`; one row per band
    (every hash its own band) when no choice reaches it (thresholds below about 0.07 with 64 hashes)."""
    for rows in range(n_hashes, 0, -1):
        bands = n_hashes // rows
        if 1.0 - (1.0 - threshold ** rows) ** bands >= RECALL_AT_THRESHOLD:
            return bands, rows
    return n_hashes, 1


def _flatten(token_rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """All token ids in one uint64 array (int64 bit patterns) and every row's length `[n]`.

    Raises:
        ValueError: if a row is not a 1-D sequence of integers.
    """
    arrays = [np.asarray(row) for row in token_rows]
    bad = next((i for i, a in enumerate(arrays) if a.ndim != 1 or (a.size and a.dtype.kind not in "iub")), None)
    if bad is not None:
        raise ValueError(f"`token_rows` must hold 1-D sequences of token ids, row {bad} has shape "
                         f"{arrays[bad].shape} and dtype {arrays[bad].dtype}.")
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate([a for a in arrays if a.size]) if lengths.any() else np.zeros(0, dtype=np.int64)
    return flat.astype(np.int64).view(np.uint64), lengths


def _shingle_hashes(tokens: np.ndarray, lengths: np.ndarray, shingle: int,
                    coefficients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the shingles of consecutive non-empty rows (`tokens`: their ids, `lengths`: theirs, >= 1), row after
    row, and how many each row has. A shingle of width w (`shingle`, or a short row's length) hashes to
    mix(w · c_shingle + Σ_j (token_j + 1) · c_j)."""
    size = tokens.size
    hashes = np.full(size, shingle, dtype=np.uint64)
    hashes *= coefficients[shingle]  # wraps modulo 2^64, as every product here
    for j in range(shingle):  # position p: the shingle that starts at p (partial sums past a row's end are dropped)
        hashes[: size - j] += (tokens[j:] + np.uint64(1)) * coefficients[j]
    starts = np.cumsum(lengths) - lengths
    keep = np.ones(size, dtype=bool)
    long = lengths >= shingle
    for j in range(1, shingle):  # the last shingle - 1 positions of a long row start no shingle
        keep[(starts + lengths - j)[long]] = False
    short = np.flatnonzero(~long)
    if short.size:  # one shingle, the whole row, at its first position
        width = lengths[short].astype(np.uint64)
        whole = width * coefficients[shingle]
        for j in range(1, shingle):
            keep[(starts[short] + j)[j < lengths[short]]] = False
        for j in range(shingle - 1):
            token = tokens[np.minimum(starts[short] + j, size - 1)]
            whole += np.where(np.uint64(j) < width, (token + np.uint64(1)) * coefficients[j], np.uint64(0))
        hashes[starts[short]] = whole
    return _mix(hashes[keep]), np.where(long, lengths - shingle + 1, 1)


def _common_shingles(flat: np.ndarray, row_lengths: np.ndarray, shingle: int, coefficients: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    """Sorted hashes of the shingles found in more than `COMMON_SHARE` of a sample of at most `COMMON_SAMPLE` of the
    non-empty rows (`flat`: their tokens in order, `row_lengths`: theirs); empty below `COMMON_MIN_ROWS` rows."""
    n = row_lengths.size
    if n < COMMON_MIN_ROWS:
        return np.zeros(0, dtype=np.uint64)
    sample = np.sort(rng.choice(n, size=min(n, COMMON_SAMPLE), replace=False))
    ends = np.cumsum(row_lengths)
    tokens = np.concatenate([flat[ends[i] - row_lengths[i]: ends[i]] for i in sample])
    hashes, per_row = _shingle_hashes(tokens, row_lengths[sample], shingle, coefficients)
    rows = np.repeat(np.arange(sample.size), per_row)
    order = np.lexsort((hashes, rows))  # by row, then hash: a row's repeats of a shingle are adjacent
    hashes, rows = hashes[order], rows[order]
    once = np.r_[True, (hashes[1:] != hashes[:-1]) | (rows[1:] != rows[:-1])]  # a shingle counted once per row
    values, counts = np.unique(hashes[once], return_counts=True)
    return values[counts > COMMON_SHARE * sample.size]


def _without_common(hashes: np.ndarray, per_row: np.ndarray, common: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the `common` shingle hashes from each row's `hashes` (`per_row` of them per row, >= 1), except in a row
    made only of common shingles, which keeps them all."""
    if common.size == 0:
        return hashes, per_row
    content = ~np.isin(hashes, common, assume_unique=False)
    starts = np.cumsum(per_row) - per_row
    left = np.add.reduceat(content.astype(np.int64), starts)
    keep = content | np.repeat(left == 0, per_row)
    return hashes[keep], np.where(left == 0, per_row, left)


def minhash_signatures(token_rows: Sequence[Any], *, shingle: int = SHINGLE, n_hashes: int = N_HASHES,
                       seed: int = ClusterSelectConfig.selection_seed) -> np.ndarray:
    """MinHash signature of every example's set of token shingles, template shingles left out (see the module
    docstring).

    Args:
        token_rows (sequence of 1-D int sequences, length `n`): token ids of every example.
        shingle (`int`, *optional*, defaults to `3`): tokens per shingle.
        n_hashes (`int`, *optional*, defaults to `64`): hash functions.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the hash functions.
    Returns:
        `np.ndarray` of shape `[n, n_hashes]`, uint32: the minimum of each hash function over each example's shingles.
    Raises:
        ValueError: if `shingle` or `n_hashes` is not an int >= 1, or a row is not a 1-D sequence of integers.
    """
    for name, value in (("shingle", shingle), ("n_hashes", n_hashes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")
    shingle, n_hashes = int(shingle), int(n_hashes)
    flat, lengths = _flatten(token_rows)
    rng = np.random.default_rng([int(seed) % 2**64, 20261222])
    coefficients = rng.integers(0, 2**63, size=shingle + 1, dtype=np.int64).astype(np.uint64) | np.uint64(1)
    multipliers = rng.integers(0, 2**63, size=n_hashes, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    offsets = rng.integers(0, 2**63, size=n_hashes, dtype=np.int64).astype(np.uint64)

    def minima(hashes: np.ndarray, per_row: np.ndarray) -> np.ndarray:  # [rows, n_hashes]
        values = np.multiply.outer(multipliers, hashes >> np.uint64(32))  # [n_hashes, shingles]: a 32-bit key each
        values += offsets[:, None]
        values >>= np.uint64(32)
        return np.minimum.reduceat(values, np.cumsum(per_row) - per_row, axis=1).T

    signatures = np.empty((lengths.size, n_hashes), dtype=np.uint32)
    empty = lengths == 0
    if empty.any():  # one shingle, the empty sequence: width 0, no token, hash mix(0) = 0
        signatures[empty] = minima(np.zeros(1, dtype=np.uint64), np.ones(1, dtype=np.int64))
    rows = np.flatnonzero(~empty)
    row_lengths = lengths[rows]
    token_ends = np.cumsum(row_lengths)  # `flat` holds the tokens of these rows, in order
    common = _common_shingles(flat, row_lengths, shingle, coefficients, rng)
    begin, block = 0, max(CHUNK_VALUES // n_hashes, 1)
    while begin < rows.size:  # blocks of about `block` tokens (shingles), whole rows
        first_token = int(token_ends[begin - 1]) if begin else 0
        end = max(int(np.searchsorted(token_ends, first_token + block, side="right")), begin + 1)
        hashes, per_row = _without_common(*_shingle_hashes(flat[first_token: token_ends[end - 1]],
                                                           row_lengths[begin:end], shingle, coefficients), common)
        signatures[rows[begin:end]] = minima(hashes, per_row)
        begin = end
    return signatures


def _candidate_pairs(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Distinct `(low, high)` row pairs `[n_pairs, 2]` (low < high) that agree on a whole band: every bucket member
    with the bucket's first row and with the next row of the bucket."""
    n = signatures.shape[0]
    found = []
    weights = _mix(np.arange(1, rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    for band in range(bands):
        keys = _mix((signatures[:, band * rows: (band + 1) * rows] * weights).sum(axis=1, dtype=np.uint64))
        order = np.argsort(keys, kind="stable")  # a bucket's rows in increasing order
        sorted_keys = keys[order]
        same = sorted_keys[1:] == sorted_keys[:-1]
        bucket_first = order[np.maximum.accumulate(np.where(np.r_[True, ~same], np.arange(n), 0))]
        found.append(np.stack([order[:-1][same], order[1:][same]], axis=1))
        found.append(np.stack([bucket_first[1:][same], order[1:][same]], axis=1))
    pairs = np.concatenate(found) if found else np.zeros((0, 2), dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(np.sort(pairs, axis=1), axis=0).astype(np.int64)


def _components(n: int, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`groups_by_first_row` of the connected components of `n` rows joined by `pairs` `[n_pairs, 2]`."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(pairs.shape[0], dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return groups_by_first_row(connected_components(graph, directed=False)[1])


def near_duplicate_groups(token_rows: Sequence[Any], threshold: float, *, shingle: int = SHINGLE,
                          n_hashes: int = N_HASHES, seed: int = ClusterSelectConfig.selection_seed,
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group examples whose token shingles have an estimated Jaccard similarity of at least `threshold`.

    MinHash (Broder 1997) → LSH banding (Indyk & Motwani 1998) → pairs verified by their estimated Jaccard →
    connected components; see the module docstring for the method, the banding and the measured time.

    Args:
        token_rows (sequence of 1-D int sequences, length `n`): token ids of every example (lists, arrays or CPU
            tensors; lengths may differ, 0 included).
        threshold (`float`): least estimated Jaccard similarity of two examples' shingle sets, in (0, 1].
        shingle (`int`, *optional*, defaults to `3`): tokens per shingle (contiguous n-gram), >= 1.
        n_hashes (`int`, *optional*, defaults to `64`): MinHash values per example, >= 1.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the hash functions; the
            same seed and rows give the same groups.
    Returns:
        `(inverse [n] int64, first [n_groups] int64, counts [n_groups] int64)`: each example's group, the first
        (lowest-index) example of each group and its size; groups numbered in order of their first example (the
        conventions of `duplicates.duplicate_groups`).
    Raises:
        ValueError: if `threshold` is outside (0, 1], `shingle` or `n_hashes` is not an int >= 1, or a row is not a
            1-D sequence of integers.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ValueError(f"`threshold` must be a float in (0, 1], got {threshold!r}.")
    signatures = minhash_signatures(token_rows, shingle=shingle, n_hashes=n_hashes, seed=seed)
    n = signatures.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    pairs = _candidate_pairs(signatures, *lsh_bands(float(threshold), int(n_hashes)))
    needed = math.ceil(float(threshold) * n_hashes - 1e-9)  # agreeing values for an estimate >= threshold
    block = max(CHUNK_VALUES // int(n_hashes), 1)
    agree = np.concatenate([np.zeros(0, dtype=np.int64)] + [
        (signatures[pairs[s: s + block, 0]] == signatures[pairs[s: s + block, 1]]).sum(axis=1)
        for s in range(0, pairs.shape[0], block)])
    return _components(n, pairs[agree >= needed])


def union_groups(*partitions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The finest partition coarser than every given one: rows that share a group in any partition share one here
    (a row in a feature-space group and a near-duplicate group joins both).

    Args:
        *partitions (array-like of shape `[n]`, int): a group id per row, one array per partition (at least one).
    Returns:
        `(inverse [n], first [n_groups], counts [n_groups])`, int64, numbered by first row (`groups_by_first_row`).
    Raises:
        ValueError: if no partition is given or their shapes differ.
    """
    arrays = [np.asarray(p).reshape(-1) for p in partitions]
    if not arrays or any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"`union_groups` needs partitions of one shape [n], got {[a.shape for a in arrays]}.")
    n = arrays[0].size
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    links = []
    for array in arrays:
        _, first, inverse = np.unique(array, return_index=True, return_inverse=True)
        links.append(np.stack([np.arange(n), first[inverse.reshape(-1)]], axis=1))
    return _components(n, np.concatenate(links))
