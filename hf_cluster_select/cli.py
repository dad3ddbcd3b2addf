"""Command-line parsing of `TrainingArguments` (or TRL's `SFTConfig`) together with `ClusterSelectConfig` (layer L5).

No `ClusterSelectConfig` field collides with `TrainingArguments` or `SFTConfig` (0.2 renamed `warmup_steps` and
`seed` to `selection_warmup_steps` and `selection_seed`), so the usual parser works as is:

    training_args, cluster_config = HfArgumentParser((TrainingArguments, ClusterSelectConfig)).parse_args_into_dataclasses()

`parse_training_and_cluster_args` does the same and still reads the 0.1 `--cluster_<field>` options (with a
`FutureWarning`). `python -m hf_cluster_select.cli` is the `hf-cluster-select` command (`hf_cluster_select.commands`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Sequence

from transformers import HfArgumentParser, TrainingArguments

from .config import RENAMED_FIELDS, ClusterSelectConfig



def make_parser(*extra_dataclasses: type, training_args_class: type = TrainingArguments) -> HfArgumentParser:
    """An `HfArgumentParser` for `training_args_class` (`TrainingArguments`, `SFTConfig`, ...), `ClusterSelectConfig`
    and any of your own argument dataclasses (`extra_dataclasses`)."""
    return HfArgumentParser((training_args_class, ClusterSelectConfig, *extra_dataclasses))


def _upgrade_legacy_options(args: Sequence[str]) -> list[str]:
    """0.1's `--cluster_<field>` options (also `--cluster-<field>`, and `--no_cluster_<bool>` /
    `--no-cluster-<bool>`) as the plain field options (`--cluster_seed` → `--selection_seed`); an option that is
    itself a field (`--cluster_method`, `--cluster_sample_size`) is left alone."""
    fields = {f.name for f in dataclasses.fields(ClusterSelectConfig)}
    upgraded, legacy = [], []
    for arg in args:
        name, sep, value = arg.partition("=")
        plain = name.replace("-", "_")
        negated = plain.startswith("__no_cluster_")
        prefix = "__no_cluster_" if negated else "__cluster_"
        if plain.startswith(prefix) and plain[2:].removeprefix("no_") not in fields:
            field = RENAMED_FIELDS.get(plain[len(prefix):], plain[len(prefix):])
            if field in fields:
                legacy.append(name)
                arg = f"--{'no_' if negated else ''}{field}{sep}{value}"
        upgraded.append(arg)
    if legacy:
        warnings.warn(f"the `--cluster_` options are deprecated and will be removed in 0.3 ({', '.join(legacy)}): "
                      "use the field names (`--data_fraction`, `--selection_warmup_steps`, `--selection_seed`).",
                      FutureWarning, stacklevel=3)
    return upgraded


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
    return tuple(parser.parse_args_into_dataclasses(args=_upgrade_legacy_options(args)))


if __name__ == "__main__":  # `python -m hf_cluster_select.cli` is the `hf-cluster-select` command
    import sys

    from .commands import main

    sys.exit(main())
