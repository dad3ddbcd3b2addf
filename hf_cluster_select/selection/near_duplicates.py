"""Near-duplicate examples by their tokens: MinHash signatures, LSH banding, exactly verified pairs, leader groups
(layer L2: numpy and scipy).

`duplicates.py` merges rows whose *features* agree to about 1e-5; an example repeated with a few tokens changed has
other features and stays a separate candidate, so a fine-KMeans stratum made of one source's near copies spends its
quota on copies. `near_duplicate_groups` finds such copies from the token ids alone, as near-duplicate removal does
for language-model training data (Lee et al., "Deduplicating Training Data Makes Language Models Better", ACL 2022;
SemDeDup, Abbas et al., arXiv 2303.09540, does it in embedding space):

1. *Shingles*: an example's set of contiguous `shingle`-grams of token ids (3-grams by default); an example shorter
   than `shingle` is one shingle, its whole sequence (so all empty examples are copies of each other).
2. *Template shingles*: a shingle found in more than `COMMON_SHARE` (half) of the rows or in more than `COMMON_ROWS`
   (32) rows is left out, so a long shared prompt (a chat template's system prompt, a task's instruction repeated on
   its rows) does not make distinct examples look alike. A row made only of such shingles keeps all of them (rows
   that are nothing but the template are still copies of each other). The prices: where one example has more than
   about 32 copies (or fills half the rows) its exact copies still join, its near copies stop joining; a prompt
   shared by 2 to 32 rows (under half) is content, so rows that share one about 11× longer than the rest of each
   row (Jaccard 0.85; 4.7× at 0.7) are near copies of each other, as a multi-task SFT pool's rows of one task are;
   and in a pool of fewer than `COMMON_MIN_ROWS` (20) rows no shingle is template (`test_near_duplicates.py`).
3. *MinHash* (Broder, "On the resemblance and containment of documents", 1997): per example, the minimum of each of
   `n_hashes` seeded hash functions over its shingles. Two examples agree on a hash with probability equal to the
   Jaccard similarity of their shingle sets. Each shingle is hashed once (a polynomial of its tokens and length,
   then the splitmix64 finaliser, whose top 32 bits are its key x); hash function i is the multiply-shift
   ((a_i · x + b_i) mod 2^64) >> 32 with seeded 64-bit a_i (odd) and b_i, a 2-independent family (Dietzfelbinger,
   STACS 1996), so a signature holds 32-bit values.
4. *LSH banding* (Indyk & Motwani, STOC 1998): the signature is cut into `bands` bands of `rows` values; examples
   that agree on a whole band are candidates. A pair at Jaccard s becomes a candidate with probability
   1 − (1 − s^rows)^bands; `lsh_bands` takes the most rows per band (fewest chance candidates) for which that is
   at least `RECALL_AT_THRESHOLD` = 0.999 at s = threshold (0.7, 64 hashes: 21 bands of 3 rows; 0.85: 12 of 5;
   0.9: 10 of 6; 1.0: 1 band of 64). Within a band's bucket each member is paired with the bucket's first
   (lowest-index) row and with the next row of the bucket, not with every other member (linear, not quadratic, in a
   bucket of many copies). Where replies are given, the banding runs a second time with each band's key also
   holding the row's whole set of reply shingles, so two rows with one reply are proposed even in a bucket of many
   rows that share their prompt content but not their reply (one SFT task's rows under its instruction).
5. *Verification*: a candidate pair is kept when the *exact* Jaccard similarity of the two rows' content shingle
   sets is at least `threshold`, and so is that of their whole shingle sets, template included (rows that differ
   only in their template parts, e.g. two long instructions over the same input, are not copies), and, where the
   replies (loss-bearing tokens) are given, so is that of their replies' shingle sets; MinHash only proposes
   pairs, so the seed changes which rare pairs are proposed, never which pairs pass.
6. *Leader groups*: in index order, a row joins the group of the lowest-index group leader (a row that leads its
   group) it is a kept pair with; otherwise it leads a new group. Every member is at least `threshold` from its
   group's first row, so two members are at Jaccard at least 2·threshold − 1 (Jaccard distance is a metric); a
   chain of near copies whose two ends are not near copies is not merged into one group, as connected components
   would.

Measured (`near_duplicate_groups` alone, one CPU thread): see `docs/configuration.md` ("Cost and report").

`union_groups` joins this partition with the feature-space one (`ClusteringResult.groups`); the pipeline
(`pipeline.select_with_model`) does so when `SelectionSettings.near_duplicate_threshold` is set.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..config import ClusterSelectConfig
from .duplicates import groups_by_first_row

SHINGLE = 3  # tokens per shingle
N_HASHES = 64  # MinHash values per example
RECALL_AT_THRESHOLD = 0.999  # least probability that a pair at exactly the threshold becomes an LSH candidate
COMMON_SHARE = 0.5  # a shingle in more than this share of the rows is template, not content
COMMON_ROWS = 32  # ... or in more than this many rows
COMMON_MIN_ROWS = 20  # fewer rows: no shingle is treated as template
CHUNK_VALUES = 1 << 22  # tokens per hashing block, shingles × hashes per signature block, hashes per verifying block
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


def _check_sizes(shingle: Any, n_hashes: Any) -> None:
    """Raise a `ValueError` naming `shingle` or `n_hashes` unless each is an int >= 1."""
    for name, value in (("shingle", shingle), ("n_hashes", n_hashes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")


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


def _tagged(values: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """uint64 keys equal exactly where both `values` (uint64 hashes) and int `tags` are (up to a 2^-64 collision):
    one 64-bit sort groups a value's repeats within a tag, faster than `np.lexsort` on the two."""
    return values ^ _mix(tags.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1))


def _repeats(keys: np.ndarray) -> np.ndarray:
    """Positions `[n_repeats]` of the entries of `keys` equal to another entry, all but one of each value."""
    order = np.argsort(keys)
    return order[1:][keys[order][1:] == keys[order][:-1]]


def _all_shingles(flat: np.ndarray, lengths: np.ndarray, shingle: int,
                  coefficients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row's shingle hashes, row after row (an empty row: the one hash 0 of the empty sequence), and how many
    each row has `[n]`; hashed in blocks of about `CHUNK_VALUES` tokens."""
    sizes = np.ones(lengths.size, dtype=np.int64)
    rows = np.flatnonzero(lengths)
    row_lengths = lengths[rows]
    token_ends = np.cumsum(row_lengths)  # `flat` holds the tokens of these rows, in order
    parts, begin = [], 0
    while begin < rows.size:  # whole rows
        first_token = int(token_ends[begin - 1]) if begin else 0
        end = max(int(np.searchsorted(token_ends, first_token + CHUNK_VALUES, side="right")), begin + 1)
        hashes, sizes[rows[begin:end]] = _shingle_hashes(flat[first_token: token_ends[end - 1]],
                                                         row_lengths[begin:end], shingle, coefficients)
        parts.append(hashes)
        begin = end
    hashes = np.zeros(int(sizes.sum()), dtype=np.uint64)
    filled = np.ones(hashes.size, dtype=bool)
    filled[(np.cumsum(sizes) - sizes)[lengths == 0]] = False
    hashes[filled] = np.concatenate(parts) if parts else hashes[:0]
    return hashes, sizes


def _content(hashes: np.ndarray, per_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's distinct shingles and distinct content shingles: `hashes` (`per_row` of them per row, row after
    row) without a row's repeats of a hash, then also without template shingles, those in more than `COMMON_SHARE` of
    the rows or in more than `COMMON_ROWS` rows (none below `COMMON_MIN_ROWS` rows); a row made only of template
    shingles keeps them all. Returns `(content hashes, content per row, distinct hashes, distinct per row)`, hashes
    in row order."""
    n = per_row.size
    if n == 0:
        return hashes, per_row, hashes, per_row
    rows = np.repeat(np.arange(n), per_row)
    order = np.argsort(hashes, kind="stable")  # a hash's rows in increasing order, its repeats in a row adjacent
    ordered, owner = hashes[order], rows[order]
    same = ordered[1:] == ordered[:-1]
    first = np.r_[True, ~same | (owner[1:] != owner[:-1])]  # a row's first of a hash
    run = np.cumsum(np.r_[True, ~same]) - 1  # which distinct hash
    content = np.ones(hashes.size, dtype=bool)
    if n >= COMMON_MIN_ROWS:
        rows_with = np.bincount(run[first])  # rows holding each distinct hash
        content[order] = (rows_with <= min(COMMON_SHARE * n, COMMON_ROWS))[run]
    once = np.zeros(hashes.size, dtype=bool)
    once[order[first]] = True
    keep = once & (content | (np.bincount(rows[once & content], minlength=n) == 0)[rows])
    return (hashes[keep], np.bincount(rows[keep], minlength=n), hashes[once], np.bincount(rows[once], minlength=n))


def _content_sets(token_rows: Sequence[Any], shingle: int, n_hashes: int, seed: int) -> tuple[np.ndarray, tuple, tuple]:
    """`(signatures [n, n_hashes] uint32, (hashes, starts [n + 1]), (all_hashes, all_starts [n + 1]))`: every row's
    MinHash signature of its content shingles, its set of content shingle hashes, `hashes[starts[i]: starts[i + 1]]`,
    and its set of all its shingle hashes, template included."""
    flat, lengths = _flatten(token_rows)
    rng = np.random.default_rng([int(seed) % 2**64, 20261222])
    coefficients = rng.integers(0, 2**63, size=shingle + 1, dtype=np.int64).astype(np.uint64) | np.uint64(1)
    multipliers = rng.integers(0, 2**63, size=n_hashes, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    offsets = rng.integers(0, 2**63, size=n_hashes, dtype=np.int64).astype(np.uint64)
    hashes, per_row, every, per_row_every = _content(*_all_shingles(flat, lengths, shingle, coefficients))
    starts = np.r_[0, np.cumsum(per_row)]
    signatures = np.empty((lengths.size, n_hashes), dtype=np.uint32)
    begin, block = 0, max(CHUNK_VALUES // n_hashes, 1)
    while begin < lengths.size:  # blocks of about `block` shingles, whole rows
        end = max(int(np.searchsorted(starts, starts[begin] + block, side="right")) - 1, begin + 1)
        values = np.multiply.outer(multipliers, hashes[starts[begin]: starts[end]] >> np.uint64(32))  # 32-bit keys
        values += offsets[:, None]
        values >>= np.uint64(32)
        signatures[begin:end] = np.minimum.reduceat(values, starts[begin:end] - starts[begin], axis=1).T
        begin = end
    return signatures, (hashes, starts), (every, np.r_[0, np.cumsum(per_row_every)])


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
    _check_sizes(shingle, n_hashes)
    return _content_sets(token_rows, int(shingle), int(n_hashes), seed)[0]


def _candidate_pairs(signatures: np.ndarray, bands: int, rows: int, salt: np.ndarray | None = None) -> np.ndarray:
    """Distinct `(low, high)` row pairs `[n_pairs, 2]` (low < high) that agree on a whole band (and on `salt` `[n]`
    uint64, where given): every bucket member with the bucket's first row and with the next row of the bucket."""
    n = signatures.shape[0]
    found = []
    weights = _mix(np.arange(1, rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    for band in range(bands):
        keys = (signatures[:, band * rows: (band + 1) * rows] * weights).sum(axis=1, dtype=np.uint64)
        keys = _mix(keys if salt is None else keys ^ salt)
        order = np.argsort(keys, kind="stable")  # a bucket's rows in increasing order
        sorted_keys = keys[order]
        same = sorted_keys[1:] == sorted_keys[:-1]
        bucket_first = order[np.maximum.accumulate(np.where(np.r_[True, ~same], np.arange(n), 0))]
        found.append(np.stack([order[:-1][same], order[1:][same]], axis=1))
        found.append(np.stack([bucket_first[1:][same], order[1:][same]], axis=1))
    pairs = np.concatenate(found) if found else np.zeros((0, 2), dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(np.sort(pairs, axis=1), axis=0).astype(np.int64)


def _exact_jaccard(pairs: np.ndarray, hashes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Jaccard similarity `[n_pairs]` of the shingle sets of each `(low, high)` pair in `pairs` `[n_pairs, 2]`
    (`hashes[starts[i]: starts[i + 1]]`: row i's distinct hashes), in blocks of about `CHUNK_VALUES` hashes."""
    sizes = np.diff(starts)
    out = np.zeros(pairs.shape[0])
    cost = np.cumsum(sizes[pairs].sum(axis=1))
    begin = 0
    while begin < pairs.shape[0]:
        end = max(int(np.searchsorted(cost, (cost[begin - 1] if begin else 0) + CHUNK_VALUES, side="right")), begin + 1)
        block = pairs[begin:end]
        both = block.reshape(-1)  # each pair's two rows, in turn
        lengths = sizes[both]
        shift = np.repeat(starts[both] - (np.cumsum(lengths) - lengths), lengths)  # position in `hashes` - in block
        values = hashes[shift + np.arange(shift.size)]
        pair = np.repeat(np.arange(both.size) // 2, lengths)
        inter = np.bincount(pair[_repeats(_tagged(values, pair))], minlength=block.shape[0])  # in both rows
        out[begin:end] = inter / (sizes[block[:, 0]] + sizes[block[:, 1]] - inter)
        begin = end
    return out


def _leader_groups(n: int, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`groups_by_first_row` of `n` rows where, in index order, a row joins the lowest-index *leader* it is paired
    with in `pairs` `[n_pairs, 2]` (low < high), and a row paired with no leader leads its own group."""
    leader = np.arange(n)
    done = np.zeros(n, dtype=bool)
    for low, high in pairs[np.lexsort((pairs[:, 0], pairs[:, 1]))].tolist():
        if not done[high] and leader[low] == low:
            leader[high], done[high] = low, True
    return groups_by_first_row(leader)


def _components(n: int, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`groups_by_first_row` of the connected components of `n` rows joined by `pairs` `[n_pairs, 2]`."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(pairs.shape[0], dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return groups_by_first_row(connected_components(graph, directed=False)[1])


def _reply_sets(reply_rows: Sequence[Any], shingle: int) -> tuple[np.ndarray, np.ndarray]:
    """`(hashes, starts [n + 1])`: every reply's set of shingle hashes, `hashes[starts[i]: starts[i + 1]]` (no
    template rule: a reply is compared whole)."""
    flat, lengths = _flatten(reply_rows)
    coefficients = np.random.default_rng(20261207).integers(0, 2**63, size=shingle + 1, dtype=np.int64)
    hashes, per_row = _all_shingles(flat, lengths, shingle, coefficients.astype(np.uint64) | np.uint64(1))
    every, per_row_every = _content(hashes, per_row)[2:]
    return every, np.r_[0, np.cumsum(per_row_every)]


def near_duplicate_groups(token_rows: Sequence[Any], threshold: float, *, reply_rows: Sequence[Any] | None = None,
                          shingle: int = SHINGLE, n_hashes: int = N_HASHES,
                          seed: int = ClusterSelectConfig.selection_seed,
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group examples whose token shingles have a Jaccard similarity of at least `threshold` with their group's first.

    Template shingles left out → MinHash (Broder 1997) → LSH banding (Indyk & Motwani 1998) → pairs verified by
    their exact Jaccard → leader groups; see the module docstring.

    Args:
        token_rows (sequence of 1-D int sequences, length `n`): token ids of every example (lists, arrays or CPU
            tensors; lengths may differ, 0 included).
        threshold (`float`): least Jaccard similarity of an example's shingle set with its group's first example's,
            in (0, 1].
        reply_rows (sequence of 1-D int sequences, length `n`, *optional*): each example's reply, the tokens that
            carry its loss (`data.reply_rows`). Given, a pair must also have replies whose shingle sets (whole, no
            template rule) are at Jaccard at least `threshold`: rows of one SFT task that share a long instruction
            and differ in their inputs and replies are then not copies. Rows that differ only in their prompts and
            share a short reply (a class name) are still compared by their prompts alone.
        shingle (`int`, *optional*, defaults to `3`): tokens per shingle (contiguous n-gram), >= 1.
        n_hashes (`int`, *optional*, defaults to `64`): MinHash values per example, >= 1.
        seed (`int`, *optional*, defaults to `ClusterSelectConfig.selection_seed`): seed of the hash functions; the
            same seed and rows give the same groups (another seed can only miss or find a rare pair: each pair at
            the threshold is proposed with probability at least 0.999).
    Returns:
        `(inverse [n] int64, first [n_groups] int64, counts [n_groups] int64)`: each example's group, the first
        (lowest-index) example of each group and its size; groups numbered in order of their first example (the
        conventions of `duplicates.duplicate_groups`).
    Raises:
        ValueError: if `threshold` is outside (0, 1], `shingle` or `n_hashes` is not an int >= 1, a row or reply is
            not a 1-D sequence of integers, or `reply_rows` has another length than `token_rows`.
    """
    if reply_rows is not None and len(reply_rows) != len(token_rows):
        raise ValueError(f"`reply_rows` must hold one reply per row of `token_rows` ({len(token_rows)}), got "
                         f"{len(reply_rows)}.")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
            or not 0.0 < threshold <= 1.0:
        raise ValueError(f"`threshold` must be a float in (0, 1], got {threshold!r}.")
    _check_sizes(shingle, n_hashes)
    signatures, content, every = _content_sets(token_rows, int(shingle), int(n_hashes), seed)
    n = signatures.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    bands = lsh_bands(float(threshold), int(n_hashes))
    pairs = _candidate_pairs(signatures, *bands)
    least = float(threshold) - 1e-12
    if reply_rows is not None:  # also the pairs of one band and one reply set: found in a bucket of one task's rows
        replies = _reply_sets(reply_rows, int(shingle))
        salt = np.add.reduceat(replies[0], replies[1][:-1])  # every reply has a shingle (an empty one: hash 0)
        pairs = np.unique(np.concatenate([pairs, _candidate_pairs(signatures, *bands, salt=salt)]), axis=0)
        pairs = pairs[_exact_jaccard(pairs, *replies) >= least]
    pairs = pairs[_exact_jaccard(pairs, *content) >= least]
    return _leader_groups(n, pairs[_exact_jaccard(pairs, *every) >= least])


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
