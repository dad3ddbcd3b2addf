"""`benchmarks/quality.py`'s command line: its options, their checks (every error before any work, exit status 2)
and the merging of earlier results (`--merge`, `--merge-only`)."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Callable

import bench_io
import quality_tasks

DEFAULT_ARMS = ["full", "random", "default", "paper_selection"]


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser; list options default to None so that `check_options` can tell a given option from a default."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--task", default=None, choices=sorted(quality_tasks.TASKS),
                        help="default 20ng; with --merge-only, the first --merge file's task")
    parser.add_argument("--fractions", type=float, nargs="+", default=None, help="default 0.1 0.3 0.5")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    parser.add_argument("--arms", nargs="+", default=None, help=f"default {' '.join(DEFAULT_ARMS)}")
    parser.add_argument("--quick", action="store_true", help="tiny pools, 1 epoch, one fraction and seed")
    parser.add_argument("--epochs", type=float, default=None, help="override the task's num_train_epochs")
    parser.add_argument("--learning-rate", type=float, default=None, help="override the task's learning rate")
    parser.add_argument("--pool", type=int, default=None,
                        help="training examples before any corruption (the 20ng tasks only; default 1000)")
    parser.add_argument("--curve", nargs="*", default=None, metavar="ARM",
                        help="arms evaluated after every epoch, the convergence check (default: full, when it "
                        "runs; none with an empty list)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: every core); 1 when two benchmarks share the machine, whose "
                        "seconds columns then measure a loaded machine")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/quality_<task>.json)")
    parser.add_argument("--merge", default=None, metavar="JSON", nargs="+",
                        help="keep the cells of earlier runs of the same task (each tagged with its commit) that "
                        "this run does not redo, and summarise them all: adds fractions or arms to a result (a "
                        "later file's cell replaces an earlier file's of the same arm, fraction and seed)")
    parser.add_argument("--merge-only", action="store_true",
                        help="run nothing: write the --merge files' cells, summarised, to --out (required)")
    bench_io.add_report_option(parser)
    return parser


def read_result(path: str, option: str) -> dict:
    """A quality result JSON (a dict with `task`, `summary` and a list of `cells`), read for `option`.

    Raises:
        ValueError: naming `option` and `path`, if the file cannot be read, is not JSON or is not such a result.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            result = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(f"{option} {path}: {error}") from None
    keys = ("task", "metric", "higher_is_better", "n_train", "n_test", "recipe", "summary", "cells")
    if not (isinstance(result, dict) and all(k in result for k in keys) and isinstance(result["task"], str)
            and isinstance(result["summary"], list) and isinstance(result["cells"], list)
            and all(isinstance(c, dict) and {"arm", "fraction", "seed"} <= set(c) for c in result["cells"])):
        raise ValueError(f"{option} {path}: not a benchmarks/quality.py result (needs {', '.join(keys)}; each cell an "
                         "arm, fraction and seed)")
    return result


def given_options(args: argparse.Namespace, names) -> list[str]:
    """The options among `names` (attribute names) that were given on the command line, as `--flag` strings."""
    return [f"--{name.replace('_', '-')}" for name in names
            if getattr(args, name) is not None and getattr(args, name) is not False]


def check_out(parser: argparse.ArgumentParser, out: str, task: str) -> None:
    """`--out` must be a new .json path or an earlier result of the same task, in a folder that can be made."""
    if os.path.splitext(out)[1] != ".json" or os.path.isdir(out):  # also refuses a bare ".json" name
        parser.error(f"--out must be a .json file path (its .md and .png are written next to it), got {out!r}")
    if os.path.exists(out):
        try:
            earlier = read_result(out, "--out")
        except ValueError as error:
            parser.error(f"{error}: it would be overwritten; pick another --out")
        if earlier["task"] != task:
            parser.error(f"--out {out} holds a {earlier['task']!r} result; this is {task!r}: pick another --out")
    folder = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        parser.error(f"--out {out}: {folder} is not a writable folder")


def load_earlier(path: str, task: str, quick: bool) -> dict:
    """The result JSON `--merge` names, each cell tagged with the commit it was measured at.
    Cells are matched by (arm, fraction, seed): an arm name whose meaning changed between the commits (`default`
    after a change of defaults) must be renamed in one of the files first.

    Raises:
        ValueError: if the file cannot be read or is not a result, holds another task's result, or a `--quick`
            result where this run is not one (or the other way round).
    """
    earlier = read_result(path, "--merge")
    if earlier["task"] != task:
        raise ValueError(f"--merge {path}: a result of task {earlier['task']!r}, not {task!r}")
    if bool(earlier.get("quick")) != quick:
        raise ValueError(f"--merge {path}: quick={bool(earlier.get('quick'))} there, quick={quick} here")
    for cell in earlier["cells"]:
        cell.setdefault("commit", earlier.get("commit"))
    return earlier


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  arm_config: Callable[[str, float, int], object] | None = None) -> dict | None:
    """Every option error before any work (argparse's message and exit status 2); resolves the defaults of
    `--task` (with `--merge-only`: the first `--merge` file's task), `--fractions`, `--seeds`, `--arms`, `--curve`.
    `--report` takes no other option (it only prints a table). `arm_config(arm, fraction, seed)` (quality.py's) builds
    each arm's `ClusterSelectConfig`, so that a wrong arm fails here, not after hours of other arms.

    Returns:
        `dict` or `None`: the `--report` file's result (read once, here), `None` without `--report`.
    """
    if args.report is not None:
        given = given_options(args, [name for name in vars(args) if name != "report"])
        if given:
            parser.error(f"--report only prints a table: {', '.join(given)} would be ignored")
        try:
            return read_result(args.report, "--report")
        except ValueError as error:
            parser.error(str(error))
    if args.merge_only:
        if not args.merge:
            parser.error("--merge-only needs --merge JSON [JSON ...]")
        if args.out is None:  # never a silent overwrite of the committed benchmarks/results/quality_<task>.json
            parser.error("--merge-only needs --out JSON (the merged result's path)")
        ignored = given_options(args, ("epochs", "learning_rate", "pool", "curve", "fractions", "seeds", "arms",
                                       "threads"))
        if ignored:
            parser.error(f"--merge-only runs nothing: {', '.join(ignored)} would be ignored")
        if args.task is None:
            try:
                args.task = read_result(args.merge[0], "--merge")["task"]
            except ValueError as error:
                parser.error(str(error))
            if args.task not in quality_tasks.TASKS:
                parser.error(f"--merge {args.merge[0]}: no benchmark task in it (got {args.task!r}); pass --task")
    args.task = args.task or "20ng"
    if args.out is not None:
        check_out(parser, args.out, args.task)
    if args.quick:  # one fraction and seed: the first given, else 0.5 and seed 0
        args.fractions, args.seeds = (args.fractions or [0.5])[:1], (args.seeds or [0])[:1]
    args.fractions = args.fractions or [0.1, 0.3, 0.5]
    args.seeds = args.seeds if args.seeds is not None else [0, 1, 2]
    args.arms = args.arms or list(DEFAULT_ARMS)
    if args.pool is not None and (not args.task.startswith("20ng") or args.quick or args.pool < 20):
        parser.error("--pool is an option of the 20ng tasks (not with --quick, whose pool is 96) and needs at least "
                     "20 documents")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    for name in ("epochs", "learning_rate"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    bad = [f for f in args.fractions if not (math.isfinite(f) and 0 < f < 1)]
    if bad:
        parser.error(f"--fractions must lie strictly between 0 and 1 (a subset's share of the pool), got {bad}")
    if any(not 0 <= seed < 2**32 for seed in args.seeds):
        parser.error(f"--seeds must be integers in [0, 2**32), got {args.seeds}")
    for name in ("arms", "fractions", "seeds"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            parser.error(f"--{name} lists a value twice ({values}): each would be trained again")
    for arm in args.arms if arm_config is not None else []:
        try:
            arm_config(arm, args.fractions[0], args.seeds[0] if args.seeds else 0)
        except (ValueError, TypeError) as error:
            parser.error(f"--arms {arm}: {error} (arms: full, random, random_same_steps, selection_same_steps, "
                         "default, paper_selection, cfg:FIELD=VALUE,...)")
    for same in ("random_same_steps", "selection_same_steps"):
        if same in args.arms and arm_config is not None and not any(
                arm_config(a, args.fractions[0], 0) is not None for a in args.arms[: args.arms.index(same)]):
            parser.error(f"--arms {same} matches the steps of a ClusterTrainer arm: list one (default, "
                         "cfg:...) before it")
    unknown = sorted(set(args.curve or []) - set(args.arms))
    if unknown:
        parser.error(f"--curve names arms this run does not train: {unknown} (arms: {args.arms})")
    args.curve = [a for a in args.arms if a == "full"] if args.curve is None else args.curve
    return None


def merged_results(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The `--merge` files' cells in one result (a later file's cell replaces an earlier file's of the same arm,
    fraction and seed); `{}` without `--merge`. Every file must hold the same task, recipe and pool."""
    earlier: dict = {}
    try:
        for path in args.merge or []:  # a wrong file fails before the task loads
            later = load_earlier(path, args.task, args.quick)
            if earlier and (later.get("recipe"), later.get("n_train")) != (earlier.get("recipe"),
                                                                           earlier.get("n_train")):
                raise ValueError(f"--merge {path}: its recipe ({later.get('recipe')}, {later.get('n_train')} "
                                 f"training examples) differs from the earlier file's ({earlier.get('recipe')}, "
                                 f"{earlier.get('n_train')})")
            keys = {(c["arm"], c["fraction"], c["seed"]) for c in later["cells"]}
            later["cells"] = [c for c in earlier.get("cells", []) if (c["arm"], c["fraction"], c["seed"]) not in keys
                              ] + later["cells"]
            later["arms"] = list(dict.fromkeys(earlier.get("arms", []) + later.get("arms", [])))
            earlier = later
    except ValueError as error:
        parser.error(str(error))
    return earlier
