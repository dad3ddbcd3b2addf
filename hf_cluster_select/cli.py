"""Command-line parsing of `TrainingArguments` (or TRL's `SFTConfig`) together with `ClusterSelectConfig` (layer L5).

No `ClusterSelectConfig` field collides with `TrainingArguments` or `SFTConfig`, so the usual parser works as is
(strategy settings as JSON: `--strategy_kwargs '{"pca_dim": 32}'`):

    training_args, cluster_config = HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses()

`parse_training_and_cluster_args` does the same. `python -m hf_cluster_select.cli` is the `hf-cluster-select` command (`hf_cluster_select.commands`).
"""

from __future__ import annotations

from typing import Sequence

from transformers import HfArgumentParser, TrainingArguments

from .config import ClusterSelectConfig



def make_parser(*extra_dataclasses: type, training_args_class: type = TrainingArguments) -> HfArgumentParser:
    """An `HfArgumentParser` for `training_args_class` (`TrainingArguments`, `SFTConfig`, ...), `ClusterSelectConfig`
    and any of your own argument dataclasses (`extra_dataclasses`)."""
    return HfArgumentParser((training_args_class, ClusterSelectConfig, *extra_dataclasses))


def parse_training_and_cluster_args(
    args: Sequence[str] | None = None, *extra_dataclasses: type, training_args_class: type = TrainingArguments
) -> tuple:
    """Parse a command line into `(training arguments, ClusterSelectConfig, *your dataclasses)`.

    Args:
        args (sequence of `str`, *optional*): the arguments; `sys.argv[1:]` when `None`.
        *extra_dataclasses (`type`): more argument dataclasses to parse alongside.
        training_args_class (`type`, *optional*): `TrainingArguments` (default) or a subclass such as TRL's
            `SFTConfig` or `Seq2SeqTrainingArguments`.
    Returns:
        `tuple`: the parsed training arguments, `ClusterSelectConfig` and one instance per extra dataclass.
    Raises:
        SystemExit: on a malformed option value, a value outside a field's choices, or `--help` (argparse).
        ValueError: on an unknown option (`HfArgumentParser` lists the ones it did not use), or from
            `ClusterSelectConfig.__post_init__` for an out-of-range value.
    """
    if args is None:
        import sys

        args = sys.argv[1:]
    parser = make_parser(*extra_dataclasses, training_args_class=training_args_class)
    return tuple(parser.parse_args_into_dataclasses(args=list(args)))


if __name__ == "__main__":  # `python -m hf_cluster_select.cli` is the `hf-cluster-select` command
    import sys

    from .commands import main

    sys.exit(main())
