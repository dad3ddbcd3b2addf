"""The `hf-cluster-select` command: `select` on a tiny model and a JSONL file, `report`, `--help`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.commands import build_parser, config_from_args, format_report, main


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tokenizer, _tiny_lm_base):
    folder = tmp_path_factory.mktemp("tiny_model")
    _tiny_lm_base.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    import tiny_assets

    texts = tiny_assets.make_texts(40, seed=3)
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    with open(path, "w") as handle:
        for i, text in enumerate(texts):
            words = text.split()
            handle.write(json.dumps({"q": " ".join(words[:3]), "a": " ".join(words[3:]), "id": i}) + "\n")
    return str(path)


def test_select_writes_dataset_report_and_a_reusable_selection(tmp_path, model_folder, data_file):
    import datasets

    out = str(tmp_path / "sel")
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--selection-seed", "3", "--output", out]) == 0
    table = datasets.load_from_disk(os.path.join(out, "dataset"))
    assert table.column_names == ["q", "a", "id", "cluster_id", "raw_cluster_id", "weight", "kept"]
    assert sum(table["kept"]) == 10 and table["id"] == list(range(40))
    weights = np.asarray(table["weight"])
    assert np.all((weights > 0) == np.asarray(table["kept"])) and weights.sum() == pytest.approx(40)
    parquet = datasets.load_dataset("parquet", data_files=os.path.join(out, "selection.parquet"), split="train")
    assert parquet["cluster_id"] == table["cluster_id"]
    report = json.load(open(os.path.join(out, "selection_report.json")))
    assert report["n_kept"] == 10 and report["config"]["selection_seed"] == 3 and report["features_seconds"] > 0
    clusters = json.load(open(os.path.join(out, "clusters.json")))
    assert sum(c["size"] for c in clusters) == 40 and sum(c["kept"] for c in clusters) == 10
    assert all(len(c["examples"]) <= 3 for c in clusters) and clusters[0]["examples"][0]
    for name in ("cluster_selection.npz", "README.md", "cluster_sizes.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    text = format_report(out)
    assert text.startswith("kept 10 of 40 examples (25.0%)") and text.count("\n| ") == len(clusters) + 1
    assert report["token_kind"] == "loss" and 0 < report["tokens_kept"] < report["tokens_total"]
    assert (f"\nkept {report['tokens_kept']} of {report['tokens_total']} loss-bearing tokens "
            f"({report['tokens_kept'] / report['tokens_total']:.1%})\n") in text
    assert "input tokens" not in text  # an example budget: no token-budget line
    # the same command again: the features come from the cache, the selection is identical
    again = str(tmp_path / "again")
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--selection-seed", "3", "--output", again]) == 0
    second = json.load(open(os.path.join(again, "selection_report.json")))
    assert report["features_from_cache"] is False and second["features_from_cache"] is True
    assert second["kept_indices"] == report["kept_indices"] and second["weights"] == report["weights"]


def test_every_config_field_is_an_option_and_none_parses():
    parser = build_parser()
    args = parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o", "--pca-dim", "None",
                              "--data-fraction", "0.4", "--balance-tokens", "false", "--within-cluster", "random"])
    config = config_from_args(args)
    assert config.cluster_settings.pca_dim is None and config.data_fraction == 0.4
    assert config.allocation_settings.balance_tokens is False and config.strategy_kwargs == {
        "balance_tokens": False, "pca_dim": None}  # only the settings given
    assert config.within_cluster == "random" and config.feature == ClusterSelectConfig().feature
    help_text = parser._subparsers._group_actions[0].choices["select"].format_help()
    for name in ("data-fraction", "cluster-sample-size", "feature-layers", "within-cluster", "stratify-column",
                 "hdbscan-min-samples", "kmeans-size-cap", "strategy-kwargs"):
        assert f"--{name}" in help_text
    hdbscan = config_from_args(parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o",
                                                  "--cluster-method", "hdbscan", "--hdbscan-min-samples", "3"]))
    assert hdbscan.cluster_settings.hdbscan_min_samples == 3
    with pytest.raises(ValueError, match="a setting of cluster_method='hdbscan'"):  # not the chosen clusterer's
        config_from_args(parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o",
                                            "--hdbscan-min-samples", "3"]))


def test_bad_columns_paths_and_values_are_one_line_errors(tmp_path, model_folder, data_file, capsys):
    base = ["select", "--model", model_folder, "--dataset", data_file, "--output", str(tmp_path / "x")]
    assert main(base) == 2
    assert "hf-cluster-select select: error:" in capsys.readouterr().err
    assert main(base + ["--text-column", "nope"]) == 2
    assert "column(s) ['nope']" in capsys.readouterr().err
    assert main(["select", "--model", model_folder, "--dataset", str(tmp_path / "no.jsonl"), "--text-column", "a",
                 "--output", str(tmp_path / "x")]) == 2
    assert "no.jsonl' does not exist" in capsys.readouterr().err
    for option, value, expected in (("--data-fraction", "abc", "data_fraction"), ("--feature-cache", "maybe",
                                    "`--feature-cache` must be true or false")):
        with pytest.raises(SystemExit) as stop:  # argparse's usage line and message, exit status 2
            main(base + ["--text-column", "a", option, value])
        assert stop.value.code == 2 and expected in capsys.readouterr().err
    with pytest.raises(ValueError, match="holds no selection_report.json"):
        format_report(str(tmp_path))
    assert main(["report", str(tmp_path)]) == 2  # the command: one line, no traceback
    assert "hf-cluster-select report: error:" in capsys.readouterr().err


def test_option_values_parse_like_hf_argument_parser():
    parser = build_parser()
    base = ["select", "--model", "m", "--dataset", "d", "--output", "o"]
    for text, expected in (("yes", True), ("1", True), ("True", True), ("no", False), ("0", False)):
        assert config_from_args(parser.parse_args(base + ["--feature-cache", text])).feature_cache is expected
    assert config_from_args(parser.parse_args(base + ["--stratify-column", "2024"])).stratify_column == "2024"


def test_an_unwritable_cache_costs_the_cache_not_the_selection(tmp_path, model_folder, data_file, monkeypatch,
                                                              caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(blocker / "cache"))
    out = tmp_path / "sel"
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--output", str(out)]) == 0
    assert "could not store the features in the cache" in caplog.text  # a logged warning (stderr without logging set up)
    assert json.load(open(out / "selection_report.json"))["n_kept"] == 10


def test_help_from_the_module():
    out = subprocess.run([sys.executable, "-m", "hf_cluster_select.cli", "select", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--data-fraction" in out.stdout and "--kept-per-cluster" in out.stdout


def test_report_states_the_token_budget_under_budget_unit_tokens(tmp_path):
    from hf_cluster_select.reporting.outputs import REPORT_FILENAME

    report = dict(n_kept=30, n_examples=100, fraction_kept=0.3, n_clusters=4, clustering_method="fine_kmeans",
                  n_noise=0, features_seconds=1.0, clustering_seconds=0.5, token_kind="loss", tokens_kept=900,
                  tokens_total=2000, input_tokens_kept=3100, input_tokens_total=10000,
                  config=dict(budget_unit="tokens", data_fraction=0.3))
    (tmp_path / REPORT_FILENAME).write_text(json.dumps(report))
    lines = format_report(str(tmp_path)).splitlines()
    assert lines[1:3] == ["kept 900 of 2000 loss-bearing tokens (45.0%)",
                          "kept 3100 of 10000 input tokens (31.0%): what budget_unit='tokens' counts"]


def test_report_into_a_closed_pipe_ends_quietly(tmp_path):
    """`hf-cluster-select report FOLDER | head -1`: no BrokenPipeError traceback when the reader leaves early."""
    import subprocess
    import sys

    from hf_cluster_select.reporting.outputs import REPORT_FILENAME

    report = dict(n_kept=1, n_examples=2, fraction_kept=0.5, n_clusters=1, clustering_method="fine_kmeans", n_noise=0)
    (tmp_path / REPORT_FILENAME).write_text(json.dumps(report))
    rows = [dict(cluster=i, size=2, kept=1, weight=2.0, mean_tokens=3.0, mean_loss=None, examples=["x" * 100])
            for i in range(3000)]  # about 0.5 MB of table: more than a pipe holds
    (tmp_path / "clusters.json").write_text(json.dumps(rows))
    command = (f"{sys.executable} -c 'from hf_cluster_select.commands import main; "
               f"raise SystemExit(main([\"report\", \"{tmp_path}\"]))' | head -1")
    completed = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False)
    assert completed.stdout.startswith("kept 1 of 2 examples (50.0%)")
    assert "Traceback" not in completed.stderr and "BrokenPipeError" not in completed.stderr
