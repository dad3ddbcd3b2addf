"""Command-line parsing of ClusterSelectConfig with TrainingArguments / SFTConfig, and its strategy settings."""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stdout

import pytest
from transformers import HfArgumentParser, TrainingArguments
from trl import SFTConfig

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.cli import parse_training_and_cluster_args
from hf_cluster_select.persistence import config_differences

CPU = ["--use_cpu", "--report_to", "none"]


def test_plain_hf_argument_parser_sets_every_kind_of_field(tmp_path):
    training, config = HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), *CPU, "--warmup_steps", "5", "--seed", "3", "--data_fraction", "0.25",
         "--selection_warmup_steps", "2", "--selection_seed", "7", "--cluster_method", "kmeans", "--feature_cache",
         "false", "--strategy_kwargs", '{"balance_tokens": false, "pca_dim": null, "kmeans_size_cap": 1.5, '
         '"cluster_sample_size": 500}'])
    assert training.warmup_steps == 5 and training.seed == 3
    assert config == ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=2, selection_seed=7,
                                         cluster_method="kmeans", feature_cache=False,
                                         strategy_kwargs={"balance_tokens": False, "pca_dim": None,
                                                          "kmeans_size_cap": 1.5, "cluster_sample_size": 500})
    assert config.cluster_settings.pca_dim is None and config.cluster_settings.kmeans_size_cap == 1.5
    assert config.allocation_settings.balance_tokens is False and config.selection_warmup_steps == 2


def test_sft_config_parses_with_the_config(tmp_path):
    training, config = HfArgumentParser((SFTConfig, ClusterSelectConfig)).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), *CPU, "--bf16", "false", "--max_length", "64", "--data_fraction", "0.4",
         "--stratify_column", "task"])
    assert isinstance(training, SFTConfig) and training.max_length == 64
    assert config.data_fraction == 0.4 and config.stratify_column == "task"
    training, config = parse_training_and_cluster_args(
        ["--output_dir", str(tmp_path), *CPU, "--bf16", "false", "--strategy_kwargs", '{"feature_layers": 2}'],
        training_args_class=SFTConfig)
    assert isinstance(training, SFTConfig) and config.feature_settings.feature_layers == 2


def test_help_lists_every_field():
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses(["--help"])
    for field in dataclasses.fields(ClusterSelectConfig):
        assert f"--{field.name}" in out.getvalue()


def test_bad_choice_range_and_unknown_option_are_rejected(tmp_path):
    with pytest.raises(SystemExit):  # a choices field: argparse refuses
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--budget_unit", "bytes"])
    with pytest.raises(ValueError, match="`within_cluster` must be one of .*got 'edge'"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--within_cluster", "edge"])
    with pytest.raises(ValueError, match="data_fraction"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--data_fraction", "1.5"])
    with pytest.raises(ValueError, match="`strategy_kwargs`: `pca_dim` must be an int >= 1 or None, got 'sixteen'"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--strategy_kwargs",
                                         '{"pca_dim": "sixteen"}'])
    with pytest.raises(ValueError, match="`strategy_kwargs` must be a JSON object, got 'pca_dim=16'"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--strategy_kwargs", "pca_dim=16"])
    with pytest.raises(ValueError, match="--no_such_option"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--no_such_option", "1"])
    with pytest.raises(ValueError, match="--pca_dim"):  # a strategy setting is not a field of its own
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--pca_dim", "8"])


def test_defaults_round_trip(tmp_path):
    _, config = parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU])
    assert config == ClusterSelectConfig()


def test_settings_equal_to_their_defaults_are_not_kept():
    """`strategy_kwargs` is canonical: a setting given at its default is the same config as one not given, so
    saved selections compare equal (`config_differences`)."""
    explicit = ClusterSelectConfig(strategy_kwargs={"pca_dim": 16, "kept_per_cluster": 4, "quota": "proportional"})
    assert explicit == ClusterSelectConfig() and explicit.strategy_kwargs == {}
    assert config_differences(explicit.to_dict(), ClusterSelectConfig().to_dict()) == []
    changed = ClusterSelectConfig(strategy_kwargs={"pca_dim": 8}).to_dict()
    assert config_differences(ClusterSelectConfig().to_dict(), changed) == ["pca_dim: 16 in the checkpoint, 8 now"]


def test_flat_values_round_trip_through_resolved():
    config = ClusterSelectConfig(cluster_method="hdbscan", strategy_kwargs={"hdbscan_min_samples": 3, "pca_dim": 8})
    flat = config.resolved()
    assert flat["hdbscan_min_samples"] == 3 and flat["noise_policy"] == "assign" and "strategy_kwargs" not in flat
    assert ClusterSelectConfig.from_flat(flat) == config
    assert ClusterSelectConfig.from_flat({"cluster_method": "kmeans", "kmeans_n_clusters": 3}).strategy_kwargs == {
        "kmeans_n_clusters": 3}
    with pytest.raises(ValueError, match="'kmeans_n_clusters' \\(a setting of cluster_method='kmeans'\\)"):
        ClusterSelectConfig.from_flat({"kmeans_n_clusters": 3})  # a non-default setting of a strategy not chosen


def test_old_field_names_say_where_settings_went():
    with pytest.raises(TypeError, match="pca_dim"):
        ClusterSelectConfig(pca_dim=8)
    with pytest.raises(ValueError, match="strategy settings go in `strategy_kwargs`"):
        ClusterSelectConfig.from_dict({"pca_dim": 8})


def test_paper_preset_errors_show_its_own_settings_and_json_text_settings_parse():
    """`paper(budget_unit="tokens")` names the preset's values (not the defaults a probe config would have), and
    `from_flat` takes `strategy_kwargs` as JSON text, as the `select` command's `--strategy-kwargs` gives it."""
    with pytest.raises(ValueError, match="got balance_tokens=False, allocation='paper', quota='uniform'"):
        ClusterSelectConfig.paper(budget_unit="tokens")
    flat = ClusterSelectConfig.from_flat({"cluster_method": "hdbscan", "strategy_kwargs": '{"hdbscan_min_samples": 2}',
                                          "pca_dim": 8})
    assert flat.strategy_kwargs == {"hdbscan_min_samples": 2, "pca_dim": 8}
    with pytest.raises(ValueError, match="`strategy_kwargs` must be a JSON object"):
        ClusterSelectConfig.from_flat({"strategy_kwargs": "{pca_dim: 8}"})
    with pytest.raises(TypeError, match="`config` must be a ClusterSelectConfig"):
        from hf_cluster_select.selection import cluster_features

        cluster_features([[0.0, 1.0]], None)
