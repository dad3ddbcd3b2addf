"""Tests of `hf_cluster_select.report` (SelectionReport, estimate_savings) and `hf_cluster_select.plots`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hf_cluster_select._types import ClusteringResult, Selection
from hf_cluster_select.config import ClusterSelectConfig
from hf_cluster_select.reporting.plots import plot_cluster_sizes
from hf_cluster_select.reporting.report import SelectionReport
from hf_cluster_select.reporting.savings import estimate_savings


def make_report(**overrides) -> SelectionReport:
    """10 examples in 3 clusters (sizes 5, 3, 2; one noise point), 4 kept."""
    values = dict(
        n_examples=10, n_kept=4, tokens_total=1000, tokens_kept=350, token_kind="loss",
        n_clusters=3, n_noise=1, cluster_sizes=[5, 3, 2], kept_per_cluster=[2, 1, 1],
        clustering_method="hdbscan", fallback=None, clustering_params={"min_cluster_size": 2, "min_samples": 1},
        config=ClusterSelectConfig(data_fraction=0.4).to_dict(), world_size=2, per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        labels=[0, 0, 0, 0, 0, 1, 1, 1, 2, 2], raw_labels=[0, 0, 0, 0, -1, 1, 1, 1, 2, 2],
        kept_indices=[0, 3, 5, 8], weights=[2.5, 2.5, 3.0, 2.0],
        warmup_seconds=10.0, features_seconds=3.0, clustering_seconds=1.5, selection_seconds=5.0,
        training_seconds=40.0, warmup_steps=20, selected_steps=80, full_data_steps=200,
    )
    values.update(overrides)
    return SelectionReport(**values)


def test_estimate_savings_from_run_throughput_exact():
    out = estimate_savings(
        warmup_seconds=10.0, warmup_steps=20, selected_steps=80, full_data_steps=200,
        selection_seconds=5.0, training_seconds=40.0,
    )
    assert out["seconds_per_step"] == 0.5
    assert out["full_data_seconds"] == 100.0
    assert out["our_seconds"] == 55.0
    assert out["seconds_saved"] == 45.0
    assert out["fraction_saved"] == 0.45
    assert out["full_data_seconds_basis"] == (
        "estimated from this run's measured throughput (0.5 s/step over 100 optimizer steps × 200 full-data steps)"
    )


def test_estimate_savings_scales_selected_steps_by_example_length():
    """The issue's case: 20 rows of 10 tokens and 4 of 2,102 tokens; the selection kept the long rows (7 of 24,
    with 4 long), so its steps are slower than full-data steps would be. The length ratio corrects the estimate."""
    lengths = [10] * 20 + [2102] * 4
    kept = [10] * 3 + [2102] * 4
    report = make_report(n_examples=24, n_kept=7, input_tokens_total=sum(lengths), input_tokens_kept=sum(kept),
                         labels=[], raw_labels=[], kept_indices=[], weights=[], warmup_steps=0, warmup_seconds=0.0,
                         selected_steps=4, full_data_steps=12, training_seconds=8.0, selection_seconds=1.0)
    ratio = (sum(lengths) / 24) / (sum(kept) / 7)
    assert report.length_ratio() == pytest.approx(ratio) and ratio < 0.3
    out = report.apply_savings()
    assert out["full_data_seconds"] == pytest.approx(8.0 * ratio / 4 * 12)  # 2 s/step × ratio × 12 steps
    assert out["seconds_saved"] < 0  # selection saved nothing here, and the estimate says so
    assert "scaled by" in out["full_data_seconds_basis"]
    with pytest.raises(ValueError, match="length_ratio"):
        estimate_savings(warmup_seconds=0, warmup_steps=0, selected_steps=1, full_data_steps=2,
                         selection_seconds=0, training_seconds=1, length_ratio=0.0)


def test_padded_tokens_per_batch():
    from hf_cluster_select.batching.padding import plan_padded_tokens, random_batch_padded_tokens

    lengths = np.array([10, 2, 3, 8])
    assert plan_padded_tokens(lengths, [[0, 1], [2, 3]]) == (2 * 10 + 2 * 8) / 2
    assert random_batch_padded_tokens(np.array([5, 5, 5]), 2, seed=0, epochs=1) == (2 * 5 + 1 * 5) / 2
    mixed = np.array([100] * 2 + [10] * 18)  # random batches of 4 often hold a long row: they pad far more
    sorted_batches = [list(range(start, start + 4)) for start in range(0, 20, 4)]  # the long rows together: 112
    assert plan_padded_tokens(mixed, sorted_batches) == 112.0 and random_batch_padded_tokens(mixed, 4, seed=0) > 150
    report = make_report(padded_tokens_per_batch_full=300.0, padded_tokens_per_batch_selected=100.0,
                         input_tokens_total=100, input_tokens_kept=40)
    assert report.length_ratio() == 3.0  # padded tokens win over the mean input tokens


def test_estimate_savings_without_warmup():
    out = estimate_savings(
        warmup_seconds=0.0, warmup_steps=0, selected_steps=300, full_data_steps=1000,
        selection_seconds=20.0, training_seconds=75.0,
    )
    assert out["seconds_per_step"] == 0.25
    assert out["full_data_seconds"] == 250.0
    assert out["seconds_saved"] == 155.0
    assert out["fraction_saved"] == 0.62
    assert out["full_data_seconds_basis"] == (
        "estimated from this run's measured throughput (0.25 s/step over 300 optimizer steps × 1,000 full-data steps)"
    )


def test_estimate_savings_measured_and_negative():
    out = estimate_savings(
        warmup_seconds=10.0, warmup_steps=20, selected_steps=80, full_data_steps=200,
        selection_seconds=5.0, training_seconds=40.0, measured_full_seconds=50.0,
    )
    assert out["full_data_seconds_basis"] == "measured"
    assert out["full_data_seconds"] == 50.0
    assert out["seconds_saved"] == -5.0
    assert out["fraction_saved"] == -0.1


@pytest.mark.parametrize(
    "overrides",
    [dict(warmup_steps=0, selected_steps=0), dict(training_seconds=-1.0), dict(selection_seconds=float("nan"))],
)
def test_estimate_savings_rejects_bad_input(overrides):
    values = dict(warmup_seconds=0.0, warmup_steps=0, selected_steps=5, full_data_steps=10,
                  selection_seconds=1.0, training_seconds=1.0)
    values.update(overrides)
    with pytest.raises(ValueError):
        estimate_savings(**values)


def test_apply_savings_fills_report():
    report = make_report()
    report.apply_savings()
    assert report.full_data_seconds == 100.0
    assert report.full_data_seconds_basis.startswith("estimated from this run's measured throughput")
    assert report.seconds_saved == 45.0 and report.fraction_saved == 0.45 and report.total_seconds == 55.0
    with pytest.raises(ValueError, match="training_seconds"):
        make_report(training_seconds=None).apply_savings()
    with pytest.raises(ValueError, match="warmup_seconds"):
        make_report(warmup_seconds=None).apply_savings()


def test_derived_fractions_and_validation():
    report = make_report()
    assert report.fraction_kept == 0.4
    assert report.fraction_tokens_kept == 0.35
    with pytest.raises(ValueError, match="token_kind"):
        make_report(token_kind="bytes")
    with pytest.raises(ValueError, match="weights"):
        make_report(weights=[1.0])
    with pytest.raises(ValueError, match="n_kept"):
        make_report(n_kept=11, kept_indices=[], weights=[])
    with pytest.raises(ValueError, match="cluster_sizes"):
        make_report(cluster_sizes=[5, 5])


def test_json_round_trip_and_atomic_save(tmp_path):
    report = make_report(fallback="all noise → one cluster")
    report.apply_savings()
    again = SelectionReport.from_json(report.to_json())
    assert again == report
    assert SelectionReport.from_dict(report.to_dict()) == report
    path = report.save(tmp_path / "sub" / "selection_report.json")
    assert os.listdir(tmp_path / "sub") == ["selection_report.json"]  # no temp file left behind
    assert SelectionReport.load(path) == report
    assert json.loads((tmp_path / "sub" / "selection_report.json").read_text())["n_kept"] == 4
    with pytest.raises(ValueError, match="not SelectionReport fields"):
        SelectionReport.from_dict({**report.to_dict(), "extra": 1})


def test_numpy_values_become_plain_json():
    report = make_report(
        n_kept=np.int64(4), labels=np.array([0, 0, 0, 0, 0, 1, 1, 1, 2, 2]),
        weights=np.array([2.5, 2.5, 3.0, 2.0]), training_seconds=np.float32(40.0),
    )
    assert type(report.n_kept) is int and type(report.labels[0]) is int and type(report.weights[0]) is float
    json.loads(report.to_json())


def test_summary_metrics_prefixed_and_skips_none():
    metrics = make_report(clustering_seconds=None).summary_metrics()
    assert all(key.startswith("cluster_select/") for key in metrics)
    assert all(isinstance(value, float) for value in metrics.values())
    assert metrics["cluster_select/fraction_kept"] == 0.4
    assert metrics["cluster_select/n_kept"] == 4.0
    assert metrics["cluster_select/n_noise"] == 1.0
    assert metrics["cluster_select/selection_seconds"] == 5.0
    assert "cluster_select/clustering_seconds" not in metrics
    assert "cluster_select/seconds_saved" not in metrics


def test_summary_metrics_label_an_estimated_full_data_time():
    report = make_report()
    report.apply_savings()
    metrics = report.summary_metrics()
    assert metrics["cluster_select/full_data_seconds_estimated"] == 100.0
    assert metrics["cluster_select/seconds_saved_estimated"] == 45.0
    assert "cluster_select/seconds_saved" not in metrics and "cluster_select/full_data_seconds" not in metrics
    report.apply_savings(measured_full_seconds=80.0)
    metrics = report.summary_metrics()
    assert metrics["cluster_select/full_data_seconds_measured"] == 80.0
    assert metrics["cluster_select/seconds_saved_measured"] == 25.0
    assert not any(key.endswith("_estimated") for key in metrics) and "cluster_select/seconds_saved" not in metrics


def test_build_from_the_outcome_the_plan_and_the_clock():
    """One builder: counts from the clustering and selection, tokens (loss-bearing when counted, else input),
    geometry and steps from the plan, seconds from the clock; `for_reuse` and `finalize` are the only later writers."""
    from types import SimpleNamespace

    from hf_cluster_select.clock import PhaseClock

    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
    clustering = ClusteringResult(
        labels=labels, raw_labels=np.array([0, 0, 0, 0, -1, 1, 1, 1, 2, 2]),
        reduced=np.zeros((10, 2), dtype=np.float32), n_clusters=3, method="hdbscan", params={"min_samples": 1},
    )
    selection = Selection(indices=np.array([0, 3, 5, 8]), weights=np.array([2.5, 2.5, 3.0, 2.0]),
                          labels=np.array([0, 0, 1, 2]), n_total=10)
    plan = SimpleNamespace(world_size=2, per_device_batch_size=4, gradient_accumulation_steps=1, warmup_steps=3,
                           selected_steps=5, full_data_steps=12)
    clock = PhaseClock()
    clock.seconds.update(warmup=2.0, features=1.5, clustering=0.5)
    lengths = np.arange(1, 11)
    report = SelectionReport.build(clustering, selection, ClusterSelectConfig(), lengths=lengths,
                                   loss_tokens=lengths - 1, plan=plan, clock=clock, feature_used="badge")
    assert report.cluster_sizes == [5, 3, 2] and report.kept_per_cluster == [2, 1, 1]
    assert report.n_noise == 1 and report.n_kept == 4 and report.fraction_kept == 0.4 and report.world_size == 2
    assert report.config == ClusterSelectConfig().to_dict() and report.feature_used == "badge"
    assert (report.token_kind, report.tokens_total, report.tokens_kept) == ("loss", 45, 0 + 3 + 5 + 8)
    assert (report.input_tokens_total, report.input_tokens_kept) == (55, 1 + 4 + 6 + 9)
    assert (report.warmup_steps, report.selected_steps, report.full_data_steps) == (3, 5, 12)
    assert (report.warmup_seconds, report.features_seconds, report.selection_seconds) == (2.0, 1.5, 2.0)
    plain = SelectionReport.build(clustering, selection, ClusterSelectConfig(), lengths=lengths)
    assert (plain.token_kind, plain.tokens_total, plain.selected_steps, plain.features_seconds) == (
        "input", 55, None, None)  # no feature pass counted, no training plan, no clock
    reused = report.for_reuse(SimpleNamespace(selected_steps=7, full_data_steps=12))
    assert (reused.warmup_steps, reused.selection_seconds, reused.selected_steps) == (0, 0.0, 7)
    assert reused.kept_indices == report.kept_indices and report.selected_steps == 5  # a copy
    clock.seconds.update(training=6.0)
    finished = reused.finalize(clock, measured_full_seconds=20.0)
    assert finished is reused and (finished.training_seconds, finished.full_data_seconds_basis) == (6.0, "measured")
    assert finished.seconds_saved == pytest.approx(20.0 - (2.0 + 0.0 + 6.0))  # warm-up + selection + training


def test_plot_cluster_sizes_writes_png(tmp_path):
    path = plot_cluster_sizes(make_report(), tmp_path / "cluster_sizes.png")
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5_000
    assert os.listdir(tmp_path) == ["cluster_sizes.png"]
    with pytest.raises(ValueError):
        plot_cluster_sizes(make_report(cluster_sizes=[], kept_per_cluster=[]), tmp_path / "empty.png")
