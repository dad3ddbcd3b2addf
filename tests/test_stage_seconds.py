"""Seconds per stage of the public selection path (`cluster_features` + `select_subset`): in the clustering's params,
the selection, the report and the `report` command; and that grouping members by cell keeps the selection as it was."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.clock import timed
from hf_cluster_select.reporting.report import SelectionReport
from hf_cluster_select.selection import cluster_features, select_subset
from hf_cluster_select.selection.select import select_from_labels

CLUSTERING_STAGES = ["screen", "dedup", "pca", "fit"]
CHOOSING_STAGES = ["inputs", "units", "quotas", "within_cluster", "weights"]


def _mixture(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(5, 8)) * 4
    return centres[rng.integers(0, 5, size=n)] + rng.normal(size=(n, 8))


def test_timed_adds_the_block_seconds_also_when_it_raises():
    seconds = {"fit": 1.0}
    with timed(seconds, "fit"):
        time.sleep(0.02)
    assert 1.015 <= seconds["fit"] < 1.5
    with pytest.raises(RuntimeError), timed(seconds, "assign"):
        time.sleep(0.01)
        raise RuntimeError("stop")
    assert 0.005 <= seconds["assign"] < 0.5


@pytest.mark.parametrize("sample_size, assigned", [(None, False), (300, True)])
def test_cluster_features_and_select_subset_time_every_stage(sample_size, assigned):
    """Every stage is timed once, in the order it ran; the stages add up to at most the total; rows placed outside
    the fit (a sample of 300 of 1,200 distinct rows) are timed as `assign`."""
    config = ClusterSelectConfig(data_fraction=0.2, strategy_kwargs={"cluster_sample_size": sample_size})
    result = cluster_features(_mixture(1200), config)
    stages = result.params["stage_seconds"]
    expected = CLUSTERING_STAGES + (["assign"] if assigned else []) + ["outputs"]
    assert list(stages) == expected
    assert all(value >= 0.0 for value in stages.values())
    assert sum(stages.values()) <= result.params["seconds"]
    assert sum(stages.values()) >= 0.5 * result.params["seconds"]  # the stages are where the time goes
    selection = select_subset(result, config)
    assert selection.n_kept == 240 and list(selection.stage_seconds) == CHOOSING_STAGES
    assert all(value >= 0.0 for value in selection.stage_seconds.values())


def test_hdbscan_on_a_sample_times_the_nearest_exemplar_placement():
    config = ClusterSelectConfig(cluster_method="hdbscan", strategy_kwargs={"cluster_sample_size": 200})
    result = cluster_features(_mixture(800), config)
    assert result.params["assignment"] == "nearest_exemplar" and "assign_seconds" not in result.params
    assert list(result.params["stage_seconds"]) == CLUSTERING_STAGES + ["assign", "outputs"]


def test_the_report_and_the_report_command_show_the_stages(tmp_path):
    """The report holds both halves in one `stage_seconds` (not in `clustering_params`), survives JSON, and
    `hf-cluster-select report` prints them; a reused selection measured none."""
    from types import SimpleNamespace

    from hf_cluster_select.commands import format_report
    from hf_cluster_select.reporting.outputs import REPORT_FILENAME

    config = ClusterSelectConfig(data_fraction=0.25)
    result = cluster_features(_mixture(400), config)
    selection = select_subset(result, config)
    report = SelectionReport.build(result, selection, config, lengths=np.full(400, 7))
    assert list(report.stage_seconds) == CLUSTERING_STAGES + ["outputs"] + CHOOSING_STAGES
    assert report.stage_seconds["fit"] == result.params["stage_seconds"]["fit"]
    assert report.stage_seconds["quotas"] == selection.stage_seconds["quotas"]
    assert "stage_seconds" not in report.clustering_params and "seconds" in report.clustering_params
    assert SelectionReport.from_json(report.to_json()).stage_seconds == report.stage_seconds
    report.save(tmp_path / REPORT_FILENAME)
    line = next(text for text in format_report(str(tmp_path)).splitlines() if text.startswith("stages: "))
    assert line.startswith("stages: screen ") and "within_cluster " in line and line.endswith(" s")
    assert len(line.split(", ")) == 10
    reused = report.for_reuse(SimpleNamespace(selected_steps=3, full_data_steps=12))
    assert reused.stage_seconds is None
    assert json.loads(reused.to_json())["stage_seconds"] is None


def _masked_reference(labels: np.ndarray, reduced: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The kept set as the per-cluster loop chose it before members were grouped by one sort: a boolean mask per
    cluster over all rows, members in dataset order, uniform weights |C| / keep, then sorted by index."""
    from hf_cluster_select.selection.budget import selection_budget
    from hf_cluster_select.selection.quotas import cluster_quotas
    from hf_cluster_select.selection.within_cluster import WITHIN_CLUSTER_RULES

    clusters = np.unique(labels)
    sizes = np.array([(labels == c).sum() for c in clusters])
    quotas = cluster_quotas(sizes, selection_budget(labels.size, fraction), "proportional")
    kept, weights = [], []
    for cluster, size, keep in zip(clusters, sizes, quotas):
        if keep == 0:
            continue
        members = np.flatnonzero(labels == cluster)
        rng = np.random.default_rng([0, int(cluster)])
        positions, w = WITHIN_CLUSTER_RULES.get("peripheral")(reduced[members], int(keep), rng)
        kept.append(members[positions])
        weights.append(w * (size / w.sum()))
    kept, weights = np.concatenate(kept), np.concatenate(weights)
    order = np.argsort(kept)
    return kept[order], weights[order]


def test_grouping_members_by_one_sort_keeps_the_selection():
    """3,000 rows in 400 interleaved clusters: the same indices and weights as masking each cluster."""
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 400, size=3000)
    reduced = rng.normal(size=(3000, 3))
    chosen = select_from_labels(labels, reduced, data_fraction=0.3, within_cluster="peripheral",
                                quota="proportional", seed=0)
    indices, weights = _masked_reference(labels, reduced, 0.3)
    assert np.array_equal(chosen.indices, indices)
    assert np.allclose(chosen.weights, weights)
    assert chosen.n_kept == 900


def test_cluster_scale_reports_the_public_path_per_stage(tmp_path):
    """`benchmarks/cluster_scale.py --methods select_defaults` at 3,000 rows, in memory and memory-mapped: the
    budget is kept exactly, the stages are recorded and the Markdown has one row per cell in the stage table."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import cluster_scale

    out = tmp_path / "scale.json"
    assert cluster_scale.main(["--sizes", "3000", "--methods", "select_defaults", "--select-memmap-rows", "3000",
                               "--timeout", "120", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cells = {cell["method"]: cell for cell in result["cells"]}
    assert set(cells) == {"select_defaults", "select_defaults_memmap"}
    for cell in cells.values():
        assert cell["n"] == 3000 and cell["n_kept"] == 900 and cell["agreement_kind"] == "homogeneity"
        assert list(cell["stage_seconds"]) == CLUSTERING_STAGES + ["outputs"] + CHOOSING_STAGES
        assert cell["truth_agreement"] > 0.9  # fine clusters inside the mixture's components
    assert cells["select_defaults_memmap"]["feature_gib"] == pytest.approx(3000 * 32 * 4 / 2**30)
    table = cluster_scale.markdown(result).split("Seconds per stage")[1]
    assert table.count("| 3,000 |") == 2
