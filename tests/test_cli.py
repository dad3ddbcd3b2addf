"""Command-line parsing of TrainingArguments + ClusterSelectConfig (the two share `warmup_steps` and `seed`)."""

from __future__ import annotations

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.cli import parse_training_and_cluster_args


def test_parses_both_with_prefixed_cluster_fields(tmp_path):
    training, config = parse_training_and_cluster_args(
        ["--output_dir", str(tmp_path), "--warmup_steps", "5", "--seed", "3", "--cluster_data_fraction", "0.25",
         "--cluster_warmup_steps", "2", "--cluster_seed", "7", "--cluster_cluster_method", "kmeans",
         "--cluster_balance_tokens", "false", "--cluster_pca_dim", "8"]
    )
    assert isinstance(training, TrainingArguments) and training.warmup_steps == 5 and training.seed == 3
    assert config == ClusterSelectConfig(data_fraction=0.25, warmup_steps=2, seed=7, cluster_method="kmeans",
                                         balance_tokens=False, pca_dim=8)


def test_defaults_round_trip(tmp_path):
    _, config = parse_training_and_cluster_args(["--output_dir", str(tmp_path)])
    assert config == ClusterSelectConfig()


def test_bad_choice_and_range_are_rejected(tmp_path):
    with pytest.raises(SystemExit):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), "--cluster_within_cluster", "edge"])
    with pytest.raises(ValueError, match="data_fraction"):
        parse_training_and_cluster_args(["--output_dir", str(tmp_path), "--cluster_data_fraction", "1.5"])


def test_plain_hf_argument_parser_conflicts():
    """Why the prefix exists: argparse refuses the duplicate options."""
    with pytest.raises(Exception, match="conflicting option"):
        HfArgumentParser((TrainingArguments, ClusterSelectConfig))
