"""The `hf-cluster-select` command: `select`, `report`, `demo` and `cache` (layer L5).

    hf-cluster-select select --model PATH --dataset FILE_OR_FOLDER --prompt-column q --completion-column a \\
        --data-fraction 0.3 --output DIR
    hf-cluster-select report DIR
    hf-cluster-select demo [--quick]
    hf-cluster-select cache list

`select` computes the features, the clusters and the selection of a dataset without training (a progress bar
over the feature batches, one line per phase) and writes to `--output` (new or empty unless `--overwrite`): the
dataset with `cluster_id`, `raw_cluster_id` (-1 = HDBSCAN noise), `weight` (0 when not kept) and `kept` columns
(`datasets.save_to_disk` in `DIR/dataset`, and `DIR/selection.parquet`), `selection_report.json`,
`cluster_selection.npz` (for `ClusterTrainer(selection=DIR)`), the model-card section and the cluster-size plot.
Every `ClusterSelectConfig` field is an option (`--data-fraction`, `--within-cluster`, `--strategy-kwargs
'{"pca_dim": 32}'`, ...; `None` sets a field to None); `--help` lists them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import os
import sys
from typing import Any, Sequence

from .config import ClusterSelectConfig, registered_settings
from .commands_report import format_report
from .settings import AUTO

__all__ = ["build_parser", "config_from_args", "format_report", "main"]


def _setting_fields() -> dict[str, dataclasses.Field]:
    """Every setting of every registered strategy, by name (`config.registered_settings`: the first taker's field)."""
    return {name: takers[0][2] for name, takers in registered_settings().items()}


def _config_options(parser: argparse.ArgumentParser) -> None:
    """One `--field-name` option per `ClusterSelectConfig` field and one per strategy setting (derived from the
    registries: a strategy a user registered brings its options), with their help texts and defaults."""
    group = parser.add_argument_group("selection settings (ClusterSelectConfig)")
    for field in dataclasses.fields(ClusterSelectConfig):
        if field.name in FIELDS_NOT_OPTIONS:
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        group.add_argument("--" + field.name.replace("_", "-"), dest="cfg_" + field.name, default=default,
                           metavar=_metavar(field), choices=field.metadata.get("choices"), type=_auto_type(field),
                           help=f"{field.metadata.get('help', '')} (default: {default!r})")
    settings = parser.add_argument_group("strategy settings (strategy_kwargs; each applies to the strategies that "
                                         "take it, docs/configuration.md)")
    for name, field in _setting_fields().items():
        settings.add_argument("--" + name.replace("_", "-"), dest="set_" + name, default=SUPPRESS_SETTING,
                              metavar=_metavar(field), choices=field.metadata.get("choices"), type=_auto_type(field),
                              help=f"{field.metadata.get('help', '')} (default: {field.default!r})")


SUPPRESS_SETTING = object()  # a strategy setting left unset: the strategy's default applies
FIELDS_NOT_OPTIONS = ("target",)  # `select` has no eval set: its `--target` is a data file (build_parser)


def _auto_type(field: dataclasses.Field) -> Any:
    """argparse `type` of an option: `auto` in any case for a field or setting whose default is `"auto"` (so that
    `AUTO` passes a choices check), the text as given otherwise."""
    if field.default != AUTO:
        return None
    return lambda text: AUTO if text.strip().lower() == AUTO else text


def _metavar(field: dataclasses.Field) -> str:
    if field.name in BOOLS_OR_AUTO:
        return "BOOL|auto"
    if field.metadata.get("choices"):
        return "|".join(field.metadata["choices"])
    kind = str(field.type).split(" |")[0]
    return "JSON" if kind == "dict" else (kind.upper() + ("|None" if "None" in str(field.type) else "")
                                          + ("|auto" if field.default == AUTO else ""))


TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")
NUMBERS_OR_AUTO = ("near_duplicate_threshold", "noise_share")  # numeric settings whose default is "auto"
BOOLS_OR_AUTO = ("balance_tokens", "reset_optimizer_state")  # bool settings that also take "auto"


def _parse_value(name: str, text: Any, default: Any) -> Any:
    """Command-line text of field or setting `name` as its value: bool ones strictly (true/false, yes/no, 1/0,
    on/off; `BOOLS_OR_AUTO` also `auto`), `None` as None where the default is None or a number, text fields (and
    the ones `ClusterSelectConfig` parses itself: `selection_warmup_steps`, `strategy_kwargs`) as given, numbers by type."""
    if not isinstance(text, str):
        return text
    if name in BOOLS_OR_AUTO and text.lower() == "auto":
        return "auto"
    if isinstance(default, bool) or name in BOOLS_OR_AUTO:
        if text.lower() not in TRUE + FALSE:
            also = " or auto" if name in BOOLS_OR_AUTO else ""
            raise ValueError(f"`--{name.replace('_', '-')}` must be true, false (also yes/no, 1/0){also}, "
                             f"got {text!r}.")
        return text.lower() in TRUE
    if name in ("selection_warmup_steps", "strategy_kwargs", "stratify_column") or \
            (isinstance(default, str) and not (default == AUTO and name in NUMBERS_OR_AUTO)):
        return None if name == "stratify_column" and text == "None" else text
    if text.strip().lower() in ("none", "null"):
        return None
    if default == AUTO and text.strip().lower() == AUTO:
        return AUTO
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def config_from_args(args: argparse.Namespace) -> ClusterSelectConfig:
    """The `ClusterSelectConfig` of the parsed options: the fields, and the strategy settings that were given
    (`ClusterSelectConfig.from_flat`). A setting given both as its own option and in `--strategy-kwargs` must mean
    the same value once each is checked (`"AUTO"` and `"auto"`, `8` and `8.0` are checked, not compared as text).

    Raises:
        ValueError/TypeError: from the config, naming the option (`--pca-dim`) for a value given as an option and
            `strategy_kwargs` for one given there; ValueError if a setting's two values differ (both named).
    """
    values = {}
    for field in dataclasses.fields(ClusterSelectConfig):
        if field.name in FIELDS_NOT_OPTIONS:
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        values[field.name] = _parse_value(field.name, getattr(args, "cfg_" + field.name), default)
    options = {name: _parse_value(name, getattr(args, "set_" + name), field.default)
               for name, field in _setting_fields().items()
               if getattr(args, "set_" + name, SUPPRESS_SETTING) is not SUPPRESS_SETTING}
    both = sorted(set(options) & set(_json_settings(values.get("strategy_kwargs"))))
    from_json = ClusterSelectConfig.from_flat(values).resolved() if both else {}  # the JSON's errors first
    config = _config_naming_options(values, options)
    from_options = config.resolved() if both else {}
    for name in both:  # each value checked on its own, then compared
        if from_json[name] != from_options[name]:
            raise ValueError(f"`{name}` is given twice: {options[name]!r} by `--{name.replace('_', '-')}` and "
                             f"{from_json[name]!r} in `--strategy-kwargs`; give it once.")
    return config


def _config_naming_options(values: dict, options: dict) -> ClusterSelectConfig:
    """`from_flat` of the fields `values` and the settings given as `options`; an error about one of those settings
    names its option (`--pca-dim`) instead of `strategy_kwargs`."""
    try:
        return ClusterSelectConfig.from_flat({**values, **options})
    except (ValueError, TypeError) as error:
        message = re.sub(r"`strategy_kwargs`: `(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`"
                         if m.group(1) in options else m.group(0), str(error))
        head, sep, tail = message.partition(". The chosen ones take")
        if head.startswith("`strategy_kwargs` has settings") and any(f"'{name}'" in head for name in options):
            for name in options:  # settings the chosen strategies do not take, typed as options
                head = head.replace(f"'{name}'", f"`--{name.replace('_', '-')}`")
            message = head.replace("`strategy_kwargs` has settings", "the options have settings", 1) + sep + tail
        message = re.sub(r"`(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`"  # a field: its option
                         if m.group(1) in values and m.group(1) != "strategy_kwargs" else m.group(0), message)
        raise type(error)(message) from error


def _json_settings(text: Any) -> dict:
    """The settings in `--strategy-kwargs` text; `{}` when there are none or the text is not a JSON object (the
    config names that problem)."""
    try:
        given = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return given if isinstance(given, dict) else {}


class _Parser(argparse.ArgumentParser):
    """argparse with a bad option as one line on stderr and exit status 2 (as every other `select` input error),
    not the usage text first; subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options).\n")


def build_parser() -> argparse.ArgumentParser:
    summary = __doc__.split("\n\n")[0].split(" (layer")[0] + "."  # the first line, without the internal layer tag
    parser = _Parser(prog="hf-cluster-select", description=summary)
    commands = parser.add_subparsers(dest="command", required=True)
    select = commands.add_parser("select", help="features, clusters and the selection of a dataset (no training)",
                                 description=__doc__.split("\n\n")[2])
    select.add_argument("--model", required=True, help="folder of a causal LM (and its tokenizer)")
    select.add_argument("--dataset", required=True,
                        help="a .json/.jsonl/.csv/.parquet file, or a folder saved with datasets.save_to_disk")
    select.add_argument("--split", default="train", help="split of a dataset dict (default: train)")
    select.add_argument("--text-column", help="plain text: loss on every token")
    select.add_argument("--prompt-column", help="prompt text (no loss); with --completion-column")
    select.add_argument("--completion-column", help="completion text (loss-bearing)")
    select.add_argument("--messages-column", help="chat messages: loss on the last message (the reply)")
    select.add_argument("--target", help="a data file (or save_to_disk folder) of examples of what the model will be "
                        "evaluated on, with the same columns as --dataset: the selection keeps the examples that "
                        "teach them (targeted selection; tasks from --target-column)")
    select.add_argument("--max-length", type=int, default=512, help="tokens kept per example (default: 512)")
    select.add_argument("--batch-size", type=int, default=8, help="examples per feature batch (default: 8)")
    select.add_argument("--output", required=True, help="folder to write (created; it must be empty unless "
                                                        "--overwrite)")
    select.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output folder (files of the same name are replaced)")
    select.add_argument("--debug", action="store_true",
                        help="raise errors with their traceback instead of the one-line message")
    _config_options(select)
    report = commands.add_parser("report", help="print the summary and per-cluster table of a `select` folder")
    report.add_argument("folder")
    report.add_argument("--examples", type=int, default=3, help="example texts shown per cluster (default: 3)")
    demo = commands.add_parser("demo", help="the README's main job (python -m hf_cluster_select.demo)")
    demo.add_argument("demo_args", nargs=argparse.REMAINDER, help="passed on, e.g. --quick")
    _cache_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hf-cluster-select`; returns the exit status (argparse exits 2 on a bad option)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "select":
        return _run_select_command(args)
    elif args.command == "report":
        try:
            print(format_report(args.folder, args.examples))
            sys.stdout.flush()
        except ValueError as error:  # no selection there: one line, not a traceback
            print(f"hf-cluster-select report: error: {error}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `report ... | head`: the reader left, nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    elif args.command == "cache":
        return run_cache(args)
    else:
        from .demo.__main__ import main as demo_main

        demo_main(list(args.demo_args))
    return 0


def _run_select_command(args: argparse.Namespace) -> int:
    """`select`: 0, or 2 after one line `hf-cluster-select select: error: ...` on stderr for a bad option value, data
    file, model or output folder (found before the model loads) and, with a hint to rerun with `--debug`, for any
    other error. `--debug` raises instead."""
    from .commands_select import InputError, run_select

    try:
        try:
            config = config_from_args(args)
        except (ValueError, TypeError) as error:  # a bad option value, named as its option (config_from_args)
            raise InputError(str(error)) from error
        run_select(args, config)
    except Exception as error:
        if args.debug:
            raise
        if isinstance(error, InputError):
            message = str(error)
        else:  # not one of the checks: its first line, and how to see where it came from
            first = (str(error).strip().splitlines() or [""])[0]
            message = f"{type(error).__name__}: {first} (rerun with --debug for the traceback)"
        print(f"hf-cluster-select select: error: {message}", file=sys.stderr)
        return 2
    return 0


def _cache_parser(commands: Any) -> None:
    """The `cache list` and `cache clear` subcommands."""
    cache = commands.add_parser("cache", help="list or clear the feature cache (features of earlier runs)")
    actions = cache.add_subparsers(dest="cache_command", required=True)
    for name, text in (("list", "one line per entry: key, size, created, examples x dim, model and data digests"),
                       ("clear", "remove every entry, or the one KEY")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--dir", help="the cache folder (default: $HF_CLUSTER_SELECT_CACHE, else "
                                          "~/.cache/hf_cluster_select/features)")
        if name == "clear":
            action.add_argument("key", nargs="?", help="an entry's key, or a prefix only it starts with")


def run_cache(args: argparse.Namespace) -> int:
    """`cache list` / `cache clear`: 0, or 2 after one line `hf-cluster-select cache ...: error: ...` on stderr."""
    from .feature_cache import FeatureCache

    cache = FeatureCache(args.dir)
    try:
        if args.dir is not None and not os.path.isdir(args.dir):
            raise ValueError(f"`--dir` {args.dir!r} is not a folder.")
        if args.cache_command == "list":
            entries = cache.entries()
            for entry in entries:
                print(format_cache_entry(entry))
            if not entries:
                print(f"no feature-cache entries in {cache.directory}", file=sys.stderr)
        else:
            removed = cache.clear(args.key)
            for key in removed:
                print(f"removed {key}")
            if not removed:
                print(f"no feature-cache entries in {cache.directory}", file=sys.stderr)
    except (ValueError, OSError) as error:
        print(f"hf-cluster-select cache {args.cache_command}: error: {error}", file=sys.stderr)
        return 2
    return 0


def format_cache_entry(entry: dict) -> str:
    """One line of `cache list`: key, size, creation time, examples x dimensions, model and data digests."""
    import time

    size, unit = float(entry["size_bytes"]), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    size = f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["created"])) if entry["created"] else "?"
    if entry["problem"]:
        return f"{entry['key']}  {size:>10}  {created}  {entry['problem']}"
    return (f"{entry['key']}  {size:>10}  {created}  {entry['n_examples']} x {entry['dim']}  "
            f"model {entry['model']}  data {entry['data']}")


if __name__ == "__main__":
    sys.exit(main())
