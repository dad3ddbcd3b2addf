"""Sharded selection, the owner's side: rows routed to their coarse group's owner, fine clusters, quotas and the
within-cluster rule there, and the kept rows all-gathered (layer L2; `sharded.select_sharded` is the entry point).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .. import distributed
from .._types import NO_LOSS_LABEL, NONFINITE_LABEL, ClusteringResult, Selection
from ..clock import timed
from ..config import ClusterSelectConfig
from .budget import selection_budget
from .duplicates import duplicate_groups
from .quotas import cluster_quotas
from .sampled import coarse_count, split_group
from .select import _checked_points, _member_picker, _select_in_cells
from .within_cluster import rule_settings_of
from .within_cluster import WITHIN_CLUSTER_RULES


def _owners(group_rows: np.ndarray, world: int) -> np.ndarray:
    """Owner rank of every coarse group: largest groups first, each to the rank holding the fewest rows so far
    (ties: lower group, lower rank)."""
    load = np.zeros(world, dtype=np.int64)
    owner = np.zeros(group_rows.size, dtype=np.int64)
    for g in np.lexsort((np.arange(group_rows.size), -group_rows)):
        owner[g] = int(np.argmin(load))
        load[owner[g]] += group_rows[g]
    return owner


def all_sum_array(values: np.ndarray) -> np.ndarray:
    """`distributed.all_sum` of a numpy array (int64 or float64 for exact sums)."""
    return distributed.all_sum(torch.from_numpy(np.ascontiguousarray(values))).numpy()


def _exchange(parts: list[np.ndarray]) -> list[np.ndarray]:
    """`distributed.exchange_rows` of numpy parts."""
    return [p.numpy() for p in distributed.exchange_rows([torch.from_numpy(np.ascontiguousarray(p)) for p in parts])]


def route_rows(index: np.ndarray, usable: np.ndarray, nonfinite: np.ndarray, projected: dict[str, np.ndarray],
               norms: np.ndarray | None, losses: np.ndarray | None, n_coarse: int,
               stages: dict[str, float]) -> dict[str, np.ndarray]:
    """Send every row to its coarse group's owner: returns what this rank received (`ints` `[r, 6]`: index, group,
    4 cells; `floats` `[r, 2 + d]`: norm, loss, reduced row) and the all-reduced `group_rows` `[n_coarse]`. Rows
    with NaN/inf features go to rank 0 as group `n_coarse`, with zero reduced rows and cells of their own.

    `projected` holds the usable rows' `reduced` `[u, d]`, `cells` `[u, 4]` and coarse `group` `[u]`; they are
    taken out of it and freed once packed, so a rank holds one packed copy of its rows, sorted by (owner, group,
    index): each owner's part is a contiguous slice, sent without a copy."""
    with timed(stages, "route"):
        group = projected.pop("group")
        group_rows = all_sum_array(np.bincount(group, minlength=n_coarse).astype(np.int64))
        owner = np.append(_owners(group_rows, distributed.world_size()), 0)
        rows = np.concatenate([usable, nonfinite])
        groups = np.concatenate([group, np.full(nonfinite.size, n_coarse)])
        del group
        destination = owner[groups]
        order = np.lexsort((index[rows], groups, destination))
        place = np.empty(order.size, dtype=np.int64)
        place[order] = np.arange(order.size)
        ints = np.empty((order.size, 6), dtype=np.int64)
        ints[:, 0], ints[:, 1] = index[rows][order], groups[order]
        ints[place[: usable.size], 2:] = projected.pop("cells")
        ints[place[usable.size:], 2:] = np.stack([index[nonfinite], np.full(nonfinite.size, -1), index[nonfinite],
                                                   np.full(nonfinite.size, -2)], axis=1).reshape(-1, 4)
        reduced = projected.pop("reduced")
        floats = np.zeros((order.size, 2 + reduced.shape[1]))
        floats[place[: usable.size], 2:] = reduced
        del reduced
        for column, values in enumerate((norms, losses)):
            if values is not None:
                floats[:, column] = values[rows][order]
        sent = np.bincount(destination, minlength=distributed.world_size())
        ends = np.cumsum(sent)
        starts = ends - sent
        ints_in = _exchange([ints[a:b] for a, b in zip(starts, ends)])
        floats_in = _exchange([floats[a:b] for a, b in zip(starts, ends)])
        del ints, floats  # with one process, the received part is this same memory
        one = len(ints_in) == 1
    return {"ints": ints_in[0] if one else np.concatenate(ints_in),
            "floats": floats_in[0] if one else np.concatenate(floats_in), "group_rows": group_rows}


def _cluster_owned(received: dict[str, np.ndarray], n_usable: int, n_clusters: int,
                   config: ClusterSelectConfig) -> dict[str, np.ndarray]:
    """Duplicate merge and fine KMeans of every coarse group this rank owns (rows in (group, index) order): the
    sorted arrays, each row's global cluster `label`, the `units` (first copy of each duplicate group) with their
    `copies`, and `n_fine` (clusters over all ranks)."""
    ints, floats, group_rows = received.pop("ints"), received.pop("floats"), received["group_rows"]
    order = np.lexsort((ints[:, 0], ints[:, 1]))
    if not np.array_equal(order, np.arange(order.size)):  # parts from several senders: merged by (group, index)
        ints, floats = ints[order], floats[order]
    del order
    n_coarse = group_rows.size
    present = np.flatnonzero(group_rows > 0)
    share = np.zeros(n_coarse + 1, dtype=np.int64)
    share[present] = cluster_quotas(group_rows[present], min(n_clusters, n_usable))
    deep = coarse_count(n_clusters)[1]
    groups, starts = np.unique(ints[:, 1], return_index=True)
    ends = np.append(starts[1:], ints.shape[0])
    fine = np.zeros(ints.shape[0], dtype=np.int64)
    k_per_group = np.zeros(n_coarse + 1, dtype=np.int64)
    units, copies = [], []
    for g, start, end in zip(groups, starts, ends):
        cells = ints[start:end, 2:]
        inverse, first, counts = duplicate_groups([(cells[:, :2], cells[:, 2:])])
        k = 1 if g == n_coarse else int(max(1, min(share[g], first.size)))
        labels = split_group(floats[start:end, 2:][first], counts, k, deep=deep,
                             sample_size=config.cluster_settings.cluster_sample_size, seed=config.selection_seed)
        fine[start:end] = labels[inverse]
        k_per_group[g] = k
        units.append(start + first)
        copies.append(counts)
    k_all = all_sum_array(k_per_group)
    offsets = np.cumsum(k_all) - k_all
    return {"ints": ints, "floats": floats, "label": offsets[ints[:, 1]] + fine, "n_fine": int(k_all.sum()),
            "n_coarse": n_coarse,
            "units": np.concatenate(units) if units else np.zeros(0, dtype=np.int64),
            "copies": np.concatenate(copies) if copies else np.zeros(0, dtype=np.int64)}


def _all_gather_selection(indices: np.ndarray, weights: np.ndarray, labels: np.ndarray,
                          n_examples: int, stages: dict[str, float]) -> Selection:
    """Every rank's kept rows, all-gathered and sorted by index, as one `Selection`."""
    with timed(stages, "gather"):
        parts = distributed.gather_objects((indices, weights, labels))
        indices, weights, labels = (np.concatenate([p[i] for p in parts]) for i in range(3))
        order = np.argsort(indices, kind="stable")
    return Selection(indices=indices[order].astype(np.int64), weights=weights[order].astype(np.float64),
                     labels=labels[order].astype(np.int64), n_total=int(n_examples), stage_seconds=stages)


def select_routed(received: dict[str, np.ndarray], n_examples: int, n_usable: int, n_nonfinite: int,
                   n_clusters: int, config: ClusterSelectConfig, deferred_index: np.ndarray,
                   stages: dict[str, float], has_norms: bool, has_losses: bool) -> tuple[Selection, dict]:
    """Fine clusters, quotas and the within-cluster rule over the rows this rank owns; then the all-gather.
    Returns the `Selection` (the same on every rank) and this rank's owned rows (`_cluster_owned`)."""
    with timed(stages, "fit"):
        owned = _cluster_owned(received, n_usable, n_clusters, config)
    ints, floats, label = owned["ints"], owned["floats"], owned["label"]
    budget = selection_budget(n_examples, config.data_fraction)
    n_eligible = n_usable + n_nonfinite
    if budget >= n_eligible:  # every eligible example, the rest of the budget from the deferred ones by index
        deferred = np.sort(np.concatenate(distributed.gather_objects(deferred_index)))[: budget - n_eligible]
        me = deferred if distributed.rank() == 0 else deferred[:0]
        kept = np.concatenate([ints[:, 0], me])
        weights = np.full(kept.size, n_examples / (n_eligible + deferred.size))
        return _all_gather_selection(kept, weights, np.concatenate([label, np.full(me.size, owned["n_fine"])]),
                                     n_examples, stages), owned
    with timed(stages, "quotas"):
        units, copies = owned["units"], owned["copies"]
        if int(all_sum_array(np.array([units.size], dtype=np.int64))[0]) < budget:  # too few distinct rows: all once
            units, copies = np.arange(ints.shape[0]), np.ones(ints.shape[0], dtype=np.int64)
        elif config.selection_settings.duplicate_weight == "one":
            copies = np.ones(units.size, dtype=np.int64)
        unit_sizes = all_sum_array(np.bincount(label[units], minlength=owned["n_fine"]).astype(np.int64))
        sizes = all_sum_array(np.bincount(label[units], weights=copies, minlength=owned["n_fine"]).astype(np.int64))
        quotas = cluster_quotas(unit_sizes, budget, config.selection_settings.quota)
    with timed(stages, "within_cluster"):
        rule = WITHIN_CLUSTER_RULES.get(config.within_cluster)
        points = floats[:, 2:] if getattr(rule, "needs_points", True) else None
        _checked_points(points, ints.shape[0], config.within_cluster, points is not None)
        clusters, position = np.unique(label[units], return_inverse=True)
        pick_for = functools.partial(_member_picker, rule, config.within_cluster, config.selection_seed,
                                     points=points, norms=floats[:, 0] if has_norms else None,
                                     losses=floats[:, 1] if has_losses else None)
        kept, weights = np.zeros(0, dtype=np.int64), np.zeros(0)
        if (quotas[clusters] > 0).any():
            kept, weights = _select_in_cells(position.reshape(-1), units, copies, clusters, sizes[clusters],
                                             quotas[clusters], pick_for, None)
        covered = int(sizes[quotas > 0].sum())
        if covered < n_examples:  # clusters, deferred examples or ("one") copies left out: weights sum to n
            weights = weights * (n_examples / covered)
    return _all_gather_selection(ints[kept, 0], weights, label[kept], n_examples, stages), owned


def clustering_of(owned: dict, deferred_index: np.ndarray, n_examples: int, params: dict) -> ClusteringResult:
    """The partition of every example, all-gathered (`[n_examples]` int64 on every rank): the fine clusters, then
    the rows with NaN/inf features (raw label `NONFINITE_LABEL`) as one more cluster and the deferred rows (no
    loss-bearing token, raw `NO_LOSS_LABEL`) as the last, as `cluster_features` numbers them; `reduced` has no
    columns and `groups` is `None` (the duplicate groups stay with their owners)."""
    ints, label = owned["ints"], owned["label"]
    raw = np.where(ints[:, 1] == owned["n_coarse"], NONFINITE_LABEL, label)
    rows = np.concatenate([np.stack([label, raw], axis=1),
                           np.tile([owned["n_fine"], NO_LOSS_LABEL], (deferred_index.size, 1))]).astype(np.int64)
    both = distributed.gather_rows(torch.from_numpy(rows), np.concatenate([ints[:, 0], deferred_index]).tolist(),
                                   n_examples).numpy()
    return ClusteringResult(labels=both[:, 0], raw_labels=both[:, 1], reduced=np.zeros((n_examples, 0), np.float32),
                            n_clusters=int(both[:, 0].max()) + 1, method="fine_kmeans", fallback=None, params=params,
                            groups=None)
