"""Command-line parsing of ClusterSelectConfig with TrainingArguments / SFTConfig, and the 0.1 field names."""

from __future__ import annotations

import dataclasses
import io
import warnings
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
         "--selection_warmup_steps", "2", "--selection_seed", "7", "--cluster_method", "kmeans",
         "--balance_tokens", "false", "--pca_dim", "None", "--kmeans_size_cap", "1.5", "--cluster_sample_size", "500"])
    assert training.warmup_steps == 5 and training.seed == 3
    assert config == ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=2, selection_seed=7,
                                         cluster_method="kmeans", balance_tokens=False, pca_dim=None,
                                         kmeans_size_cap=1.5, cluster_sample_size=500)
    assert config.pca_dim is None and config.kmeans_size_cap == 1.5 and config.selection_warmup_steps == 2


def test_sft_config_parses_with_the_config(tmp_path):
    training, config = HfArgumentParser((SFTConfig, ClusterSelectConfig)).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), *CPU, "--bf16", "false", "--max_length", "64", "--data_fraction", "0.4",
         "--stratify_column", "task"])
    assert isinstance(training, SFTConfig) and training.max_length == 64
    assert config.data_fraction == 0.4 and config.stratify_column == "task"
    training, config = parse_training_and_cluster_args(
        ["--output_dir", str(tmp_path), *CPU, "--bf16", "false", "--feature_layers", "2"], training_args_class=SFTConfig)
    assert isinstance(training, SFTConfig) and config.feature_layers == 2


def test_help_lists_every_field():
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses(["--help"])
    for field in dataclasses.fields(ClusterSelectConfig):
        assert f"--{field.name}" in out.getvalue()


def test_legacy_prefixed_options_still_parse_with_a_warning(tmp_path):
    with pytest.warns(FutureWarning, match="--cluster_seed"):
        _, config = parse_training_and_cluster_args(
            ["--output_dir", str(tmp_path), *CPU, "--cluster_data_fraction", "0.25", "--cluster_warmup_steps", "2",
             "--cluster_seed", "7", "--cluster_cluster_method", "kmeans", "--cluster_pca_dim=8"])
    assert config == ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=2, selection_seed=7,
                                         cluster_method="kmeans", pca_dim=8)
    with pytest.warns(FutureWarning):  # the dash and negated spellings HfArgumentParser also accepted in 0.1
        _, config = parse_training_and_cluster_args(
            ["--output_dir", str(tmp_path), *CPU, "--cluster-data-fraction", "0.2", "--cluster-seed", "7",
             "--no_cluster_balance_tokens"])
    assert (config.data_fraction, config.selection_seed, config.balance_tokens) == (0.2, 7, False)
    with pytest.warns(FutureWarning):
        _, config = parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--no-cluster-balance-tokens"])
    assert config.balance_tokens is False
    with warnings.catch_warnings():  # `--cluster_method` is a field of its own, not a legacy option
        warnings.simplefilter("error", FutureWarning)
        _, config = parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--cluster_method", "hdbscan"])
    assert config.cluster_method == "hdbscan"


def test_bad_choice_range_and_unknown_option_are_rejected(tmp_path):
    with pytest.raises(SystemExit):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--within_cluster", "edge"])
    with pytest.raises(ValueError, match="data_fraction"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--data_fraction", "1.5"])
    with pytest.raises(ValueError, match="`pca_dim` must be an int or None, got 'sixteen'"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--pca_dim", "sixteen"])
    with pytest.raises(ValueError, match="--no_such_option"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU, "--no_such_option", "1"])


def test_defaults_round_trip(tmp_path):
    _, config = parse_training_and_cluster_args(["--output_dir", str(tmp_path), *CPU])
    assert config == ClusterSelectConfig()


def test_old_names_are_deprecated_aliases():
    with pytest.warns(FutureWarning, match="will be removed in 0.3"):
        config = ClusterSelectConfig(seed=5, warmup_steps=0)
    assert (config.selection_seed, config.selection_warmup_steps) == (5, 0)
    with pytest.warns(FutureWarning, match="selection_warmup_steps"):
        assert config.warmup_steps == 0
    with pytest.warns(FutureWarning):
        config.seed = 9
    assert config.selection_seed == 9 and "seed" not in config.to_dict()
    with pytest.raises(TypeError, match="`selection_seed` given twice"), pytest.warns(FutureWarning):
        ClusterSelectConfig(seed=1, selection_seed=2)
    with pytest.warns(FutureWarning):
        assert ClusterSelectConfig.paper(seed=3).selection_seed == 3


def test_selections_saved_by_0_1_keep_their_meaning():
    old = dict(ClusterSelectConfig().to_dict())
    old["seed"], old["warmup_steps"] = old.pop("selection_seed"), old.pop("selection_warmup_steps")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # reading a saved dict does not warn
        assert ClusterSelectConfig.from_dict(old) == ClusterSelectConfig()
    changed = ClusterSelectConfig(selection_seed=3).to_dict()
    assert config_differences(old, changed) == ["selection_seed: 42 in the checkpoint, 3 now"]


def test_text_values_of_optional_fields():
    config = ClusterSelectConfig(pca_dim="None", kmeans_size_cap="2", projection_dim=" 32 ", stratify_column="None")
    assert (config.pca_dim, config.kmeans_size_cap, config.projection_dim, config.stratify_column) == (None, 2.0, 32, None)
    with pytest.raises(ValueError, match="`kmeans_size_cap` must be a number or None, got 'big'"):
        ClusterSelectConfig(kmeans_size_cap="big")
