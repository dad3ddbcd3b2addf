"""Command-line parsing of `TrainingArguments` together with `ClusterSelectConfig` (layer L5).

`HfArgumentParser((TrainingArguments, ClusterSelectConfig))` cannot work as is: both classes have `warmup_steps`
and `seed` (different meanings), and argparse refuses two `--warmup_steps` options. `parse_training_and_cluster_args`
exposes every `ClusterSelectConfig` field with a `--cluster_` prefix (`--cluster_data_fraction 0.3`,
`--cluster_warmup_steps 10`, `--cluster_seed 0`), keeping HfArgumentParser's types, defaults, choices and help.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from transformers import HfArgumentParser, TrainingArguments

from .config import ClusterSelectConfig

PREFIX = "cluster_"


def _prefixed_dataclass() -> type:
    fields = []
    for f in dataclasses.fields(ClusterSelectConfig):
        default = f.default if f.default is not dataclasses.MISSING else None
        fields.append((PREFIX + f.name, f.type, dataclasses.field(default=default, metadata=dict(f.metadata))))
    return dataclasses.make_dataclass("ClusterSelectArguments", fields)


def make_parser(*extra_dataclasses: type) -> HfArgumentParser:
    """An `HfArgumentParser` for `TrainingArguments`, the prefixed `ClusterSelectConfig` fields, and any of your
    own argument dataclasses (`extra_dataclasses`)."""
    return HfArgumentParser((TrainingArguments, _prefixed_dataclass(), *extra_dataclasses))


def parse_training_and_cluster_args(
    args: Sequence[str] | None = None, *extra_dataclasses: type
) -> tuple:
    """Parse a command line into `(TrainingArguments, ClusterSelectConfig, *your dataclasses)`.

    Args:
        args (sequence of `str`, *optional*): the arguments; `sys.argv[1:]` when `None`.
        *extra_dataclasses (`type`): more argument dataclasses to parse alongside.
    Returns:
        `tuple`: the parsed `TrainingArguments`, `ClusterSelectConfig` and one instance per extra dataclass.
    Raises:
        SystemExit: on a malformed option value or `--help` (argparse's behaviour).
        ValueError: on an unknown option (`HfArgumentParser` lists the ones it did not use).
        ValueError: from `ClusterSelectConfig.__post_init__` for an out-of-range value.
    """
    parsed = make_parser(*extra_dataclasses).parse_args_into_dataclasses(args=args)
    training, prefixed, *rest = parsed
    values = {f.name: getattr(prefixed, PREFIX + f.name) for f in dataclasses.fields(ClusterSelectConfig)}
    return (training, ClusterSelectConfig(**values), *rest)


if __name__ == "__main__":  # `python -m hf_cluster_select.cli` is the `hf-cluster-select` command
    import sys

    from .commands import main

    sys.exit(main())
