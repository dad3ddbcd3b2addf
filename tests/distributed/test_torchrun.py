"""Real multi-process ClusterTrainer runs (torchrun, gloo on CPU, `use_cpu=True`, one thread per process).

One 2-process job runs the `main`, `resume`, `select0`, `paper`, `paper_resume`, `target` and `curriculum` scenarios of
`worker.py` and one
3-process job runs `main3`, `select0` and `select0_again` (features from the cache); the tests below assert on what every rank wrote, with exact id lists
recomputed here from the sampler (accelerate deals batch `k` of the global plan to rank `k % world_size`).
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import tiny_assets  # noqa: E402
from launch import torchrun  # noqa: E402

from hf_cluster_select import ClusterSelectConfig  # noqa: E402
from hf_cluster_select.batching.plan import batches_per_rank  # noqa: E402
from hf_cluster_select.batching.sampler import ClusterBatchSampler  # noqa: E402

pytestmark = pytest.mark.distributed

WORKER = os.path.join(HERE, "worker.py")
METRICS = ("cluster_select/max_tokens_per_rank", "cluster_select/mean_tokens_per_rank",
           "cluster_select/max_over_mean_tokens")


def _load(folder: str, scenario: str, nproc: int) -> list[dict]:
    records = []
    for rank in range(nproc):
        with open(os.path.join(folder, scenario, f"rank{rank}.json")) as f:
            record = json.load(f)
        record["params"] = torch.load(os.path.join(folder, scenario, f"params_rank{rank}.pt"))
        records.append(record)
    return records


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The 2-process job: every scenario's per-rank records."""
    folder = str(tmp_path_factory.mktemp("torchrun2"))
    scenarios = ("main", "resume", "select0", "paper", "paper_resume", "target", "curriculum")
    torchrun([WORKER, folder, ",".join(scenarios)], nproc=2, timeout=300)
    runs = {s: _load(folder, s, 2) for s in scenarios}
    runs["folder"] = folder
    return runs


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """The 3-process job (uneven splits over 3 ranks)."""
    folder = str(tmp_path_factory.mktemp("torchrun3"))
    scenarios = ("main3", "select0", "select0_again", "sharded")
    torchrun([WORKER, folder, ",".join(scenarios)], nproc=3, timeout=300)
    return {s: _load(folder, s, 3) for s in scenarios}


@pytest.fixture(scope="module")
def lengths():
    """Token length of each of the 90 tiny examples (what the trainer balances on)."""
    tokenizer = tiny_assets.build_tokenizer()
    return np.array([len(x) for x in tiny_assets.build_dataset(tokenizer, n=90)["input_ids"]], dtype=np.int64)


def _config(scenario: str) -> ClusterSelectConfig:
    import worker

    spec = worker.SCENARIOS[scenario]
    spec_config = spec["config"]
    return ClusterSelectConfig.paper(**spec_config) if spec.get("paper") else ClusterSelectConfig.from_flat(spec_config)


def _trained(record: dict, epoch: int) -> list[list[int]]:
    return [m["ids"] for m in record["seen"] if m["epoch"] == epoch]


def _expected_subset_batches(records, scenario, lengths, epoch) -> list[list[list[int]]]:
    """Per rank, the subset batches of `epoch` as the global plan deals them: rank r gets batches r, r+W, ..."""
    config, selection, world = _config(scenario), records[0]["selection"], len(records)
    indices = np.asarray(selection["indices"])
    sampler = ClusterBatchSampler(indices=indices, labels=selection["labels"], lengths=lengths[indices],
                                  world_size=world, per_device_batch_size=4, seed=config.selection_seed,
                                  balance_tokens=config.allocation_settings.balance_tokens, window=config.allocation_settings.balance_window,
                                  allocation=config.allocation,
                                  difficulty=selection["difficulty"] if config.order == "easy_to_hard" else None)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    return [batches[r::world] for r in range(world)]


# ---- 1. sharded feature extraction, one selection everywhere -------------------------------------------------
@pytest.mark.parametrize("job, scenarios", [("two", ("main", "select0", "paper")), ("three", ("main3", "select0"))])
def test_features_are_sharded_and_selection_identical_on_every_rank(job, scenarios, request):
    runs = request.getfixturevalue(job)
    for scenario in scenarios:
        records = runs[scenario]
        world, n = len(records), records[0]["plan"]["n_examples"]
        for record in records:  # each rank computed its own strided shard, once
            assert record["feature_indices"] == [list(range(record["rank"], n, world))], scenario
            assert record["selection"] == records[0]["selection"], scenario  # bit-identical (JSON floats are exact)
            # the feature matrix (and with the noise filter, on by default and off in the paper preset, its input
            # states) go to rank 0 only: the other ranks never hold more than their shard's rows
            to_rank0 = [call for call in record["gathered"] if call["dst"] == 0]
            assert len(to_rank0) == (1 if scenario == "paper" else 2), scenario
            shard = len(range(record["rank"], n, world))
            for matrix in to_rank0:
                assert matrix["sent"][0] == shard, scenario
                assert matrix["received"] == ([n, matrix["sent"][1]] if record["rank"] == 0 else None), scenario


def test_a_second_run_loads_the_features_on_every_rank(three):
    """The feature cache under torchrun: rank 0 finds the features, every rank skips the feature pass, and the
    selection is the first run's, bit for bit."""
    first, again = three["select0"], three["select0_again"]
    assert [r["features_from_cache"] for r in first] == [False] * 3
    assert [r["features_from_cache"] for r in again] == [True] * 3
    assert [r["feature_indices"] for r in again] == [[], [], []]
    assert all(r["selection"] == first[0]["selection"] for r in again)


def _cached_features(cache: str) -> dict[str, np.ndarray]:
    """The arrays of the one entry in the feature-cache folder `cache`, read by `FeatureCache.load` with the identity
    stored beside them (`losses` of a truncated feature pass too: the curriculum order's difficulty)."""
    from hf_cluster_select.feature_cache import FeatureCache

    (entry,) = [e for e in os.listdir(cache) if not e.startswith(".")]
    with open(os.path.join(cache, entry, "identity.json"), encoding="utf-8") as handle:
        arrays = FeatureCache(cache).load(json.load(handle))
    assert arrays is not None, entry
    return {name: np.asarray(value) for name, value in arrays.items()}


def test_selection_matches_one_process_run(two, tmp_path, monkeypatch):
    """One process computes the features the 2-process run gathered (to float32 rounding: each rank batches its
    own shard by length, so padding widths, and with them the last bits, differ), and given those gathered features
    it makes that run's selection bit for bit: rank 0's clustering + broadcast is the one-process selection."""
    import worker

    from hf_cluster_select.features import FEATURES, FeatureOutput, resolve_feature

    distributed_selection = two["select0"][0]["selection"]
    gathered = _cached_features(os.path.join(two["folder"], "feature-cache", "select0"))
    assert gathered["features"].shape[0] == 90 and (gathered["loss_tokens"] > 0).all()

    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(tmp_path / "own-cache"))
    own = worker.build_trainer("select0", str(tmp_path / "own"), cls=worker.ClusterTrainer)
    own.plan()
    own.run_selection()
    assert own.args.world_size == 1
    computed = _cached_features(str(tmp_path / "own-cache"))
    np.testing.assert_allclose(computed["features"], gathered["features"], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(computed["loss_tokens"], gathered["loss_tokens"])
    np.testing.assert_allclose(computed["norms"], gathered["norms"], rtol=1e-5)
    np.testing.assert_allclose(computed["inputs"], gathered["inputs"], rtol=0, atol=1e-5)
    assert computed.keys() == gathered.keys()
    # its own selection may differ where the greedy medoid choice has a near-tie, by a member or two at most
    assert len(set(own.selection.indices.tolist()) & set(distributed_selection["indices"])) >= 34  # of 36

    def the_gathered_features(model, dataset, indices, *args, **kwargs):
        assert list(indices) == list(range(90))  # one process: every example
        return FeatureOutput(features=torch.from_numpy(gathered["features"].copy()),
                             loss_tokens=torch.from_numpy(gathered["loss_tokens"].copy()), seconds=0.0,
                             norms=torch.from_numpy(gathered["norms"].copy()),
                             losses=torch.from_numpy(gathered["losses"]) if "losses" in gathered else None,
                             inputs=torch.from_numpy(gathered["inputs"].copy()))  # select0 runs the noise filter

    the_gathered_features.input_states = True  # as the built-in features: the noise filter runs on the replay too

    name, _ = resolve_feature(own.model, own.cluster_config.feature, own.cluster_config.feature_settings.feature_layers)
    monkeypatch.setitem(FEATURES._entries, name, the_gathered_features)
    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(tmp_path / "replay-cache"))
    single = worker.build_trainer("select0", str(tmp_path / "replay"), cls=worker.ClusterTrainer)
    single.plan()
    single.run_selection()
    assert single.selection.indices.tolist() == distributed_selection["indices"]
    assert single.selection.weights.tolist() == distributed_selection["weights"]
    assert single.selection.labels.tolist() == distributed_selection["labels"]
    assert single.selection_run.raw_labels.tolist() == distributed_selection["raw_labels"]


def test_sharded_selection_gathers_no_feature_row(three, tmp_path, monkeypatch):
    """`sharded=True` on 3 ranks: each rank computes its strided shard's features and keeps them (only per-example
    counts, losses and labels, at most 2 columns, are gathered), every rank gets the same 36-of-90 selection,
    training sees exactly the kept examples, and one process given the same settings selects nearly the same set
    (its features differ in the last bits: each rank pads its own batches)."""
    import worker

    records = three["sharded"]
    selection = records[0]["selection"]
    for record in records:
        assert record["feature_indices"] == [list(range(record["rank"], 90, 3))]
        assert record["selection"] == selection
        assert record["gathered"] and all(call["sent"][1] <= 2 for call in record["gathered"])
    assert len(selection["indices"]) == 36 and sum(selection["weights"]) == pytest.approx(90.0)
    assert len(selection["all_labels"]) == 90 and max(selection["labels"]) < max(selection["all_labels"]) + 1
    trained = {i for r in records for m in r["seen"] if m["epoch"] >= 1 for i in m["ids"]}
    assert trained == set(selection["indices"])
    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(tmp_path / "cache"))
    single = worker.build_trainer("sharded", str(tmp_path / "one"), cls=worker.ClusterTrainer)
    single.plan()
    single.run_selection()
    params = single.selection_report.clustering_params
    assert params["sharded"] is True  # and what "auto" resolved to: no token check on sharded selection
    assert (params["near_duplicate_threshold"], params["duplicate_weight"]) == (None, "group")
    assert len(set(single.selection.indices.tolist()) & set(selection["indices"])) >= 32  # 34 measured


# ---- 2. no double sharding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("job, scenarios", [("two", ("main", "select0", "curriculum")),
                                            ("three", ("main3", "select0"))])
def test_each_rank_sees_exactly_its_share(job, scenarios, lengths, request):
    runs = request.getfixturevalue(job)
    for scenario in scenarios:
        records = runs[scenario]
        plan = records[0]["plan"]
        kept = sorted(records[0]["selection"]["indices"])
        first_subset_epoch = 1 if plan["warmup_steps"] else 0
        assert sorted(map(int, records[0]["subset_batches"])) == list(
            range(first_subset_epoch, first_subset_epoch + plan["selected_epochs"]))
        for epoch in sorted(map(int, records[0]["subset_batches"])):
            expected = _expected_subset_batches(records, scenario, lengths, epoch)
            union = []
            for record in records:
                rank = record["rank"]
                iterated = record["subset_batches"][str(epoch)]
                assert record["subset_loader_len"] == len(iterated) == plan["selected_batches_per_epoch"]
                assert iterated == expected[rank], (scenario, epoch, rank)  # exact ids, in order
                assert _trained(record, epoch) == expected[rank], (scenario, epoch, rank)
                ids = [i for batch in iterated for i in batch]
                assert len(ids) == len(set(ids)), "an index twice on one rank within an epoch"
                union += ids
            assert sorted(union) == kept  # every kept example exactly once over all ranks (no pad needed here)
        if plan["warmup_steps"]:  # the warm-up on the full data: disjoint shares of one global order
            warm = [[i for batch in _trained(r, 0) for i in batch] for r in records]
            for record, ids in zip(records, warm):
                assert record["warmup_loader_len"] == len(record["warmup_batches"])
                assert record["warmup_loader_len"] == plan["warmup_steps"] * plan["gradient_accumulation_steps"]
                assert _trained(record, 0) == record["warmup_batches"]
                assert len(ids) == len(set(ids))
            assert len({i for ids in warm for i in ids}) == sum(len(ids) for ids in warm)


# ---- 3. equal batches and steps on every rank ----------------------------------------------------------------
@pytest.mark.parametrize("job, scenarios", [("two", ("main", "resume", "select0", "paper", "paper_resume",
                                                    "curriculum")), ("three", ("main3", "select0"))])
def test_every_rank_takes_the_planned_steps(job, scenarios, request):
    runs = request.getfixturevalue(job)
    for scenario in scenarios:
        records = runs[scenario]
        plan = records[0]["plan"]
        micro_per_step = [[sum(1 for m in r["seen"] if m["step"] == s) for s in range(plan["total_steps"])]
                          for r in records]
        for record in records:
            assert record["global_step"] == record["max_steps"] == plan["total_steps"], scenario
            assert record["plan"] == plan
        assert all(counts == micro_per_step[0] for counts in micro_per_step), scenario
        # gradient accumulation: full steps of `gradient_accumulation_steps` micro-batches, the epoch's rest last
        accumulation, batches = plan["gradient_accumulation_steps"], plan["selected_batches_per_epoch"]
        rest = [batches % accumulation] if batches % accumulation else []
        epoch_steps = [accumulation] * (batches // accumulation) + rest
        expected = [accumulation] * plan["warmup_steps"] + epoch_steps * plan["selected_epochs"]
        first = {"resume": 4, "paper_resume": 3}.get(scenario, 0)
        assert micro_per_step[0][first:] == expected[first : plan["total_steps"]], scenario


def test_three_ranks_uneven_split(three):
    plan = three["main3"][0]["plan"]
    # 54 kept over 3 ranks × 4 per batch: 5 batches per rank (60 slots), accumulation 2: steps of 2, 2, 1 batches
    assert (plan["n_kept"], plan["selected_batches_per_epoch"], plan["selected_steps_per_epoch"]) == (54, 5, 3)
    assert plan["total_steps"] == 7


# ---- 4. resume -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run, resumed, step, n_micro", [("main", "resume", 4, 8), ("paper", "paper_resume", 3, 3)])
def test_resume_replays_the_same_ids_and_weights(two, run, resumed, step, n_micro):
    for full, again in zip(two[run], two[resumed]):
        assert again["feature_indices"] == []  # selection read from the checkpoint, never recomputed
        assert again["selection"] == full["selection"] and again["plan"] == full["plan"]
        tail = [(m["step"], m["epoch"], m["ids"], m["weights"]) for m in full["seen"] if m["step"] >= step]
        assert [(m["step"], m["epoch"], m["ids"], m["weights"]) for m in again["seen"]] == tail
        # main: the 2nd subset epoch's last step (2 micro-batches) and the 3rd epoch (6); paper: 3 of 6 steps
        assert len(tail) == n_micro
        for name, value in full["params"].items():
            assert torch.allclose(value, again["params"][name], atol=1e-6), name
    for name, value in two[run][0]["params"].items():  # DDP kept the ranks' weights identical
        assert torch.equal(value, two[run][1]["params"][name]), name


# ---- 5. token balance measured and logged ----------------------------------------------------------------------
def _check_token_logs(records, first_step: int) -> int:
    checked, previous = 0, first_step
    step_tokens = [{} for _ in records]
    for per_rank, record in zip(step_tokens, records):
        for m in record["seen"]:
            per_rank[m["step"] + 1] = per_rank.get(m["step"] + 1, 0) + m["tokens"]
    for entry in records[0]["logs"]:
        if "loss" not in entry or entry["step"] <= first_step:
            continue
        steps = range(previous + 1, entry["step"] + 1)
        busiest = [max(t[s] for t in step_tokens) for s in steps]
        average = [sum(t[s] for t in step_tokens) / len(records) for s in steps]
        assert entry[METRICS[0]] == pytest.approx(np.mean(busiest))
        assert entry[METRICS[1]] == pytest.approx(np.mean(average))
        assert entry[METRICS[2]] == pytest.approx(np.mean(np.array(busiest) / np.array(average)))
        for record in records[1:]:  # every rank logs the same numbers
            twin = next(e for e in record["logs"] if e.get("step") == entry["step"] and "loss" in e)
            assert all(twin[k] == entry[k] for k in METRICS)
        previous = entry["step"]
        checked += 1
    return checked


def test_token_balance_is_logged_per_step(two, three):
    assert _check_token_logs(two["main"], 0) == 7  # logging_steps=1
    assert _check_token_logs(two["resume"], 4) == 3
    assert _check_token_logs(two["select0"], 0) >= 2  # logging_steps=2: means over two steps
    assert _check_token_logs(three["main3"], 0) == 7
    ratios = [e[METRICS[2]] for e in two["main"][0]["logs"] if "loss" in e]
    assert all(1.0 <= r < 1.5 for r in ratios)


# ---- 6. CluSTER's allocation ---------------------------------------------------------------------------------
def test_paper_allocation_one_cluster_per_rank(two, lengths):
    import worker

    records = two["paper"]
    plan, selection = records[0]["plan"], records[0]["selection"]
    all_labels = np.asarray(selection["all_labels"])
    clusters, sizes = np.unique(all_labels, return_counts=True)
    assert len(clusters) == 2
    kept_labels = np.asarray(selection["labels"])
    largest = max(int((kept_labels == c).sum()) for c in clusters)
    # uneven kept clusters: the largest one sets the batch count, beyond the balanced plan's
    assert plan["selected_batches_per_epoch"] == math.ceil(largest / 4) > batches_per_rank(plan["n_kept"], 2, 4)
    expected = _expected_subset_batches(records, "paper", lengths[worker.uneven_indices(65)], 0)
    for record in records:
        rank, cluster = record["rank"], clusters[record["rank"]]
        assert _trained(record, 0) == expected[rank]
        ids = [i for batch in _trained(record, 0) for i in batch]
        assert set(ids) == set(np.asarray(selection["indices"])[kept_labels == cluster].tolist())
        weight = 2 * sizes[rank] / plan["n_examples"]  # K·|C_k|/N
        for m in record["seen"]:
            assert all(all_labels[i] == cluster for i in m["ids"])
            assert m["weights"] == pytest.approx([weight] * len(m["ids"]), rel=1e-6)


def test_targeted_selection_on_two_ranks(two):
    """A target set over 2 ranks: features of pool and target sharded, one selection on rank 0, the same on both
    ranks, the budget split evenly over the two target tasks, and training on exactly the kept examples."""
    records = two["target"]
    assert records[0]["selection"] == records[1]["selection"]
    target = records[0]["target"]
    assert target == records[1]["target"]
    assert target["task_names"] == ["a", "b"] and target["n_target_per_task"] == [3, 3]
    assert sorted(target["kept_per_task"]) == [18, 18]  # budget 36 of 90, round-robin over 2 tasks
    assert target["coverage_kept"] == 0 and target["mean_relevance_kept"] > target["mean_relevance_pool"]
    kept = set(records[0]["selection"]["indices"])
    assert len(kept) == 36
    trained = {i for r in records for batch in r["seen"] for i in batch["ids"]}
    assert trained == kept
    assert np.allclose([w for r in records for b in r["seen"] for w in b["weights"]], 1.0)


# ---- 7. curriculum order -------------------------------------------------------------------------------------
def test_easy_to_hard_on_two_ranks(two):
    """`order="easy_to_hard"` over 2 ranks: one selection and one difficulty everywhere (so one global plan: the
    exact ids per rank are checked against it in `test_each_rank_sees_exactly_its_share`), and the union of each
    micro-step's batches over the ranks runs up the loss: within every cluster no member of a later step is easier
    than one of an earlier step, and the second half of each epoch is harder than the first."""
    records = two["curriculum"]
    selection = records[0]["selection"]
    assert records[1]["selection"] == selection and [r["batch_order"] for r in records] == ["easy_to_hard"] * 2
    plan = records[0]["plan"]
    assert (plan["n_kept"], plan["warmup_steps"], plan["selected_batches_per_epoch"]) == (36, 1, 5)
    loss = dict(zip(selection["indices"], selection["difficulty"]))
    cluster = dict(zip(selection["indices"], selection["labels"]))
    assert len(set(loss.values())) == 36
    for epoch in (1, 2):
        per_rank = [_trained(r, epoch) for r in records]
        steps = [per_rank[0][j] + per_rank[1][j] for j in range(plan["selected_batches_per_epoch"])]
        assert sorted(i for step in steps for i in step) == sorted(selection["indices"])
        for c in set(cluster.values()):
            stream = [sorted(loss[i] for i in step if cluster[i] == c) for step in steps]
            stream = [x for x in stream if x]
            assert all(a[-1] <= b[0] for a, b in zip(stream, stream[1:])), (epoch, c)
        means = [np.mean([loss[i] for i in step]) for step in steps]
        assert np.mean(means[:2]) < np.mean(means[-2:]), epoch
