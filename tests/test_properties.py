"""Reliability (issue 5), invariants over random inputs (hypothesis): random n, fractions, cluster structures,
degenerate rows, world sizes, batch sizes and gradient accumulation.

- selection: the budget is exact, indices unique, sorted and in range, weights finite, positive and summing to n,
  deferred (no-loss) examples kept only when the budget needs them;
- clustering → selection: every example gets a label (none lost), non-finite and no-loss rows are counted exactly
  and kept out of the clusters;
- sampler as accelerate shards it (`BatchSamplerShard` per simulated rank): every rank gets the same number of
  batches, equal to the step plan's `selected_batches_per_epoch`; every kept index once per epoch (twice only for
  the documented pad, never twice on one rank);
- step plan: errors exactly when the inputs are impossible; otherwise the counts add up and `locate` inverts them.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hf_cluster_select._types import NO_LOSS_LABEL, NONFINITE_LABEL
from hf_cluster_select.batching.plan import MAX_EXAMPLES_FACTOR
from hf_cluster_select.selection import cluster_features
from hf_cluster_select.config import ClusterSelectConfig
from hf_cluster_select.batching.sampler import ClusterBatchSampler
from hf_cluster_select.schedule import plan_steps
from hf_cluster_select.selection import select_from_labels, select_subset, selection_budget

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
fractions = st.one_of(st.sampled_from([1e-9, 0.001, 0.5, 0.999, 1.0]), st.floats(1e-6, 1.0))


def check_selection(chosen, n, fraction):
    budget = selection_budget(n, fraction)
    assert chosen.n_kept == budget and chosen.n_total == n
    assert chosen.indices.dtype == np.int64 and np.all(np.diff(chosen.indices) > 0)  # sorted, unique
    assert chosen.indices.min() >= 0 and chosen.indices.max() < n
    assert np.isfinite(chosen.weights).all() and (chosen.weights > 0).all()
    assert math.isclose(chosen.weights.sum(), n, rel_tol=1e-9)


@FAST
@given(
    n=st.integers(1, 300), n_clusters=st.integers(1, 12), fraction=fractions, seed=st.integers(0, 2**31),
    within=st.sampled_from(["peripheral", "central", "random"]), quota=st.sampled_from(["proportional", "uniform"]),
    deferred_share=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
)
def test_selection_budget_indices_weights(n, n_clusters, fraction, seed, within, quota, deferred_share):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_clusters, n)
    deferred = rng.random(n) < deferred_share
    chosen = select_from_labels(labels, rng.normal(size=(n, 3)), data_fraction=fraction, within_cluster=within,
                                quota=quota, seed=seed, deferred=deferred)
    check_selection(chosen, n, fraction)
    assert np.array_equal(chosen.labels, labels[chosen.indices])
    eligible = np.flatnonzero(~deferred) if not deferred.all() else np.arange(n)
    kept = set(chosen.indices.tolist())
    if chosen.n_kept <= eligible.size:
        assert kept <= set(eligible.tolist())  # no-loss examples only when the budget needs them
        sizes = Counter(labels[eligible].tolist())
        if quota == "proportional" and chosen.n_kept >= len(sizes):
            assert set(Counter(chosen.labels.tolist())) == set(sizes)  # every cluster represented
    else:
        assert set(eligible.tolist()) <= kept


@st.composite
def feature_sets(draw):
    n = draw(st.integers(1, 90))
    dim = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    structure = draw(st.sampled_from(["blobs", "noise", "constant", "duplicates"]))
    if structure == "blobs":
        centers = rng.normal(size=(draw(st.integers(1, 5)), dim)) * 4
        features = centers[rng.integers(0, len(centers), n)] + 0.1 * rng.normal(size=(n, dim))
    elif structure == "noise":
        features = rng.normal(size=(n, dim))
    elif structure == "constant":
        features = np.ones((n, dim))
    else:  # a few distinct rows, each repeated
        rows = rng.normal(size=(draw(st.integers(1, 4)), dim))
        features = rows[rng.integers(0, len(rows), n)]
    nonfinite = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 1.0]))
    features[nonfinite, rng.integers(0, dim)] = rng.choice([np.nan, np.inf, -np.inf])
    tokens = np.where(rng.random(n) < draw(st.sampled_from([0.0, 0.2])), 0, rng.integers(1, 50, n))
    return features, tokens, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=feature_sets(), method=st.sampled_from(["hdbscan", "kmeans"]), fraction=fractions,
       world_size=st.integers(1, 4))
def test_clustering_and_selection_lose_no_example(data, method, fraction, world_size):
    features, tokens, seed = data
    n = features.shape[0]
    config = ClusterSelectConfig(cluster_method=method, data_fraction=fraction, selection_seed=seed % 1000, strategy_kwargs={"hdbscan_min_cluster_size": None if seed % 2 else 2} if method == "hdbscan" else None)
    result = cluster_features(features, config, world_size=world_size, loss_tokens=tokens)
    no_loss = tokens == 0
    nonfinite = ~np.isfinite(features).all(axis=1) & ~no_loss
    assert result.labels.shape == (n,) and np.array_equal(np.unique(result.labels), np.arange(result.n_clusters))
    assert np.isfinite(result.reduced).all() and result.reduced.shape[0] == n
    assert result.n_nonfinite == nonfinite.sum() and result.n_no_loss == no_loss.sum()
    assert np.array_equal(result.raw_labels == NONFINITE_LABEL, nonfinite)
    assert np.array_equal(result.raw_labels == NO_LOSS_LABEL, no_loss)
    clustered = set(result.labels[~nonfinite & ~no_loss].tolist())
    for rows in (nonfinite, no_loss):  # each kind is one group of its own, apart from the clusters
        if rows.any():
            assert len(set(result.labels[rows].tolist())) == 1 and not set(result.labels[rows].tolist()) & clustered
    chosen = select_subset(result, config)
    check_selection(chosen, n, fraction)
    if chosen.n_kept <= n - no_loss.sum():
        assert not no_loss[chosen.indices].any()


@st.composite
def geometries(draw):
    world_size = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 6))
    accumulation = draw(st.integers(1, 4))
    n_kept = world_size * batch * accumulation + draw(st.integers(0, 120))
    n_examples = n_kept + draw(st.integers(0, 200))
    return world_size, batch, accumulation, n_kept, n_examples


@FAST
@given(geometry=geometries(), n_clusters=st.integers(1, 5), balance=st.booleans(), window=st.integers(1, 8),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 2), warmup=st.integers(0, 5),
       epochs=st.sampled_from([1, 2, 0.5, 1.3]))
def test_every_rank_gets_the_planned_batches(geometry, n_clusters, balance, window, seed, epoch, warmup, epochs):
    world_size, batch, accumulation, n_kept, n_examples = geometry
    rng = np.random.default_rng(seed)
    plan = plan_steps(n_examples=n_examples, n_kept=n_kept, world_size=world_size, per_device_batch_size=batch,
                      gradient_accumulation_steps=accumulation, warmup_steps=0, num_train_epochs=epochs)
    indices = np.sort(rng.choice(n_examples, n_kept, replace=False))
    sampler = ClusterBatchSampler(indices, rng.integers(0, n_clusters, n_kept), rng.integers(1, 300, n_kept),
                                  world_size=world_size, per_device_batch_size=batch, seed=seed,
                                  balance_tokens=balance, window=window)
    sampler.set_epoch(epoch)
    full = list(sampler)
    assert len(full) == len(sampler) and len(sampler) % world_size == 0
    assert len(sampler) // world_size == plan.selected_batches_per_epoch
    assert math.ceil(plan.selected_batches_per_epoch / accumulation) == plan.selected_steps_per_epoch
    per_rank = [list(BatchSamplerShard(sampler, num_processes=world_size, process_index=r, split_batches=False,
                                       even_batches=True)) for r in range(world_size)]
    assert {len(x) for x in per_rank} == {plan.selected_batches_per_epoch}
    for r in range(world_size):
        assert per_rank[r] == full[r::world_size]
    seen = Counter(i for x in per_rank for b in x for i in b)
    assert sorted(seen) == indices.tolist()  # no index lost
    # none repeated, except the documented pad when there are fewer kept examples than batches (B == 1 or m < W):
    # then G·W − m examples appear twice, never twice on one rank
    assert sum(seen.values()) == max(n_kept, len(sampler)) and max(seen.values()) <= 2
    assert all(len(rank) == len(set(rank)) for rank in ([i for b in x for i in b] for x in per_rank))
    assert all(1 <= len(b) <= (MAX_EXAMPLES_FACTOR * batch if balance else batch) for b in full)  # token budgets vary
    # the warm-up sampler over the full data: exactly warmup × accumulation batches per rank
    if warmup:
        warm = ClusterBatchSampler(np.arange(n_examples), np.zeros(n_examples, dtype=np.int64),
                                   rng.integers(1, 300, n_examples), world_size=world_size,
                                   per_device_batch_size=batch, seed=seed,
                                   num_batches=warmup * accumulation * world_size)
        counts = {len(list(BatchSamplerShard(warm, num_processes=world_size, process_index=r, split_batches=False,
                                             even_batches=True))) for r in range(world_size)}
        assert counts == {warmup * accumulation}


@FAST
@given(n_examples=st.integers(1, 400), fraction=fractions, world_size=st.integers(1, 4), batch=st.integers(1, 8),
       accumulation=st.integers(1, 4), warmup=st.integers(0, 40), epochs=st.sampled_from([0.3, 1, 2, 2.5]),
       max_steps=st.sampled_from([-1, -1, 5, 30, 100]))
def test_step_plan_is_exact_or_refused(n_examples, fraction, world_size, batch, accumulation, warmup, epochs,
                                       max_steps):
    n_kept = selection_budget(n_examples, fraction)
    global_batch = world_size * batch * accumulation
    kwargs = dict(n_examples=n_examples, n_kept=n_kept, world_size=world_size, per_device_batch_size=batch,
                  gradient_accumulation_steps=accumulation, warmup_steps=warmup, num_train_epochs=epochs,
                  max_steps=max_steps)
    full_steps = math.ceil(epochs * math.ceil(math.ceil(n_examples / (world_size * batch)) / accumulation))
    impossible = n_kept < global_batch or warmup >= (max_steps if max_steps > 0 else full_steps)
    event("refused" if impossible else "planned")
    if impossible:
        with pytest.raises(ValueError):
            plan_steps(**kwargs)
        return
    plan = plan_steps(**kwargs)
    assert plan.total_steps == plan.warmup_steps + plan.selected_steps
    if max_steps > 0:
        assert plan.total_steps == max_steps
    else:
        assert plan.selected_steps == math.ceil(epochs * plan.selected_steps_per_epoch)
        assert plan.full_data_steps == full_steps
    lengths = [plan.epoch_lengths(e)[1] for e in range(plan.num_epochs)]
    assert sum(lengths) >= plan.total_steps > sum(lengths[:-1])  # only the last epoch may be cut short
    assert plan.selected_batches_per_epoch == math.ceil(n_kept / (world_size * batch))
    for step in range(plan.total_steps + 1):  # a run resumed at `step` continues where it stopped
        epoch, skip = plan.locate(step)
        assert sum(lengths[:epoch]) + skip // accumulation == step and skip % accumulation == 0
        if step < plan.total_steps:
            assert epoch < plan.num_epochs and skip < plan.epoch_lengths(epoch)[0]
