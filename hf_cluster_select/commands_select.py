"""`hf-cluster-select select`: a selection without training, written for inspection and reuse (layer L5).

Reads a dataset, tokenizes it for a causal LM (loss on the text, the completion, or the last assistant turn),
computes the configured learning-effect features with the model as it is (no warm-up: there is no training run),
clusters, selects, and writes the outputs described in `commands.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import tempfile
from typing import Any

import numpy as np

from .config import ClusterSelectConfig
from .loss_tokens import IGNORE_INDEX

DATA_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt")  # one of them: a folder with a tokenizer


class InputError(ValueError):
    """A bad `select` input (option, data, model or output folder), found and named before any feature work."""


def _cause(error: BaseException) -> str:
    """The innermost cause of `error` (libraries wrap theirs) as `Type: first line`, at most 200 characters."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__


def check_inputs(args: argparse.Namespace) -> None:
    """The checks `select` makes before it reads a row or loads a model: `--max-length` and `--batch-size` >= 1, a
    `--model` folder with `config.json` and tokenizer files, and an `--output` folder that is not a file nor an input,
    is empty unless `--overwrite`, and can be written (it is created here, and a temporary file in it).

    Raises:
        InputError: naming the option and what is wrong with it.
    """
    for name in ("max_length", "batch_size"):
        value = getattr(args, name)
        if value < 1:
            raise InputError(f"`--{name.replace('_', '-')}` must be >= 1, got {value}.")
    if not os.path.exists(args.model):
        raise InputError(f"`--model` {args.model!r} does not exist: give a local folder saved with "
                         f"`model.save_pretrained(folder)`.")
    if not os.path.isdir(args.model):
        raise InputError(f"`--model` must be a model folder, got {args.model!r}.")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise InputError(f"`--model` {args.model!r} has no config.json: save the model there with "
                         f"`model.save_pretrained(folder)`.")
    if not any(os.path.isfile(os.path.join(args.model, name)) for name in TOKENIZER_FILES):
        raise InputError(f"`--model` {args.model!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save it "
                         f"there with `tokenizer.save_pretrained(folder)`.")
    _check_causal_lm(args.model)
    output = args.output
    if os.path.exists(output) and not os.path.isdir(output):
        raise InputError(f"`--output` {output!r} is a file, not a folder.")
    if os.path.realpath(output) in (os.path.realpath(args.model), os.path.realpath(args.dataset)):
        raise InputError(f"`--output` {output!r} is an input of the command: choose another folder.")
    try:
        if os.path.isdir(output) and os.listdir(output) and not getattr(args, "overwrite", False):
            raise InputError(f"`--output` {output!r} is not empty: pass `--overwrite` to write into it (files of the "
                             f"same name are replaced) or choose a new folder.")
        os.makedirs(output, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as error:
        raise InputError(f"`--output` {output!r} cannot be written ({_cause(error)}).") from None


OUTPUT_COLUMNS = ("cluster_id", "raw_cluster_id", "weight", "kept")  # what `run_select` adds to the user's rows


def _check_causal_lm(model: str) -> None:
    """An `InputError` if the folder's config names architectures and none is a causal language model (a saved
    `BertForSequenceClassification` would load as a causal LM with a new, untrained head and select silently)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        architectures = AutoConfig.from_pretrained(model).architectures or []
    except Exception as error:
        raise InputError(f"`--model` {model!r}: its config.json does not load ({_cause(error)}).") from error
    if architectures and not set(architectures) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        raise InputError(f"`--model` {model!r} is a {', '.join(architectures)}, not a causal language model: `select` "
                         f"takes causal LMs only (use `ClusterTrainer` for a classification head).")


@contextlib.contextmanager
def _quiet_datasets():
    """No `datasets` log lines nor progress bars while a data file loads: a failure is reported once, by `select`."""
    import datasets

    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def load_rows(path: str, split: str, option: str = "--dataset"):
    """A `datasets.Dataset` from a data file (.json/.jsonl/.csv/.parquet) or a `save_to_disk` folder.

    Raises:
        InputError (naming `option`): if the path does not exist, has another extension, is empty, cannot be read (not a `save_to_disk`
            folder, corrupt JSON, CSV or Parquet), holds no rows, or has no split `split` (a data file and a
            `Dataset` folder have the one split "train").
    """
    import datasets

    kind = DATA_KINDS.get(os.path.splitext(path)[1].lower())
    if not os.path.exists(path):
        raise InputError(f"`{option}` {path!r} does not exist.")
    if not os.path.isdir(path) and (not os.path.isfile(path) or kind is None):
        raise InputError(f"`{option}` must be a {sorted(DATA_KINDS)} file or a save_to_disk folder, got {path!r}.")
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise InputError(f"`{option}` {path!r} is an empty file.")
    try:
        with _quiet_datasets():
            if os.path.isdir(path):
                loaded = datasets.load_from_disk(path)
            else:
                loaded = datasets.load_dataset(kind, data_files=path, split="train")
    except Exception as error:  # the library's own errors, wrapped differently per format: its innermost cause
        if "corresponds to no data" in str(error):  # datasets' words for a file without rows
            raise InputError(f"`{option}` {path!r} holds no rows.") from error
        what = "a folder saved with `datasets.save_to_disk`" if os.path.isdir(path) else f"{kind} data"
        raise InputError(f"`{option}` {path!r} cannot be read as {what} ({_cause(error)}).") from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InputError(f"`--split {split}` is not in {path!r} (splits: {sorted(loaded)}).")
        loaded = loaded[split]
    elif split != "train":
        raise InputError(f"`--split {split}` is not in {path!r}: it has the one split 'train' (`--split` chooses "
                         f"a split of a DatasetDict folder).")
    if len(loaded) == 0:
        raise InputError(f"`{option}` {path!r} holds no rows" + (f" in split {split!r}." if split != "train" else "."))
    return loaded


def _strata(rows, column: str | None) -> list | None:
    """The `--stratify-column` value of every row (`None` without one).

    Raises:
        InputError: if the dataset has no such column.
    """
    if column is None:
        return None
    if column not in rows.column_names:
        raise InputError(f"`--stratify-column` {column!r} is not a column of the dataset (columns: "
                         f"{rows.column_names}).")
    return list(rows[column])


def _text(row: dict, column: str, option: str, index: int) -> str:
    """`row[column]` if it is a string; else an `InputError` naming the option, the column and the row (a null reply
    or a number would otherwise be trained on as the text "None" or "3")."""
    value = row[column]
    if not isinstance(value, str):
        raise InputError(f"`{option}` {column!r} must hold text, got {type(value).__name__} {value!r} in row {index}.")
    return value


def _last_reply(row: dict, column: str, index: int) -> tuple[list, str]:
    """`(messages, last message's content)` of `row[column]`; an `InputError` naming --messages-column, the column and
    the row unless it is a non-empty list of messages whose last has a string "content"."""
    messages = row[column]
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or not isinstance(last.get("content"), str):
        raise InputError(f"`--messages-column` {column!r} must hold a non-empty list of messages whose last has text "
                         f"\"content\", got {messages!r} in row {index}.")
    return messages, last["content"]


def tokenize(rows, tokenizer, args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Tokenized examples (`input_ids`, `attention_mask`, `labels`, -100 where no loss) and a text per example.

    Raises:
        InputError: unless exactly one of --text-column, --prompt-column + --completion-column, --messages-column
            is given and names a column of the dataset; if a text, prompt or completion value is not a string, or a
            messages value is not a non-empty list whose last message has string "content".
    """
    modes = [m for m in ("text", "prompt", "messages") if getattr(args, f"{m}_column")]
    if len(modes) != 1 or (args.prompt_column is None) != (args.completion_column is None):
        raise InputError("give exactly one of --text-column, --prompt-column with --completion-column, or "
                         "--messages-column.")
    missing = [f"`--{m.replace('_', '-')}` {getattr(args, m)!r}" for m in
               ("text_column", "prompt_column", "completion_column", "messages_column")
               if getattr(args, m) and getattr(args, m) not in rows.column_names]
    if missing:
        raise InputError(f"{', '.join(missing)} not a column of the dataset (columns: {rows.column_names}).")
    examples, texts = [], []
    for index, row in enumerate(rows):
        if args.text_column:
            prompt, answer = "", _text(row, args.text_column, "--text-column", index)
        elif args.prompt_column:
            prompt = _text(row, args.prompt_column, "--prompt-column", index)
            answer = _text(row, args.completion_column, "--completion-column", index)
        else:
            messages, answer = _last_reply(row, args.messages_column, index)
            prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            answer_ids = answer_ids + [tokenizer.eos_token_id]
        answer_ids = answer_ids[: args.max_length]
        prompt_ids = prompt_ids[max(0, len(prompt_ids) - (args.max_length - len(answer_ids))):]
        ids = prompt_ids + answer_ids
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids),
                         "labels": [IGNORE_INDEX] * len(prompt_ids) + answer_ids})
        texts.append((prompt + " " + answer).strip())
    return examples, texts


def inspection(result, weights, kept, lengths, losses, texts, examples: int = 3,
               relevance: dict | None = None) -> list[dict]:
    """Per cluster: size, kept, total weight of its kept examples, mean tokens, mean loss (nats, under the model as
    given: `select` has no warm-up), with a target its relevance (mean max-cosine of its members to the nearest
    target task) and the texts of its first kept examples (then of the others). `weights` / `kept` are per example
    `[n]` (0 / False if dropped)."""
    rows = []
    for cluster in range(result.n_clusters):
        members = np.flatnonzero(result.labels == cluster)
        order = np.concatenate([members[kept[members]], members[~kept[members]]])[:examples]
        rows.append(dict(cluster=cluster, size=int(members.size), kept=int(kept[members].sum()),
                         weight=float(weights[members].sum()), mean_tokens=float(lengths[members].mean()),
                         mean_loss=None if losses is None else float(losses[members].mean()),
                         **({} if relevance is None else {"relevance": relevance.get(cluster)}),
                         examples=[texts[i] for i in order]))
    return rows


def _target_set(args: argparse.Namespace, config: ClusterSelectConfig, tokenizer, n_examples: int):
    """The `--target` file tokenized as the dataset, its tasks from `--target-column`; `None` without `--target`.

    Raises:
        InputError: for a target file that does not load, lacks the dataset's columns or the target column, has a
            target column with missing values or one value, more tasks than the target share of the budget, or a
            combination targeted selection does not take.
    """
    import datasets

    from ._types import TargetSet
    from .config import check_target_combination
    from .data import token_digest
    from .integrations.target import check_budget
    from .persistence import data_fingerprint

    column = config.target_settings.target_column
    if getattr(args, "target", None) is None:
        if column is not None or config.strategy_kwargs.keys() & {"target_rule", "target_coverage"}:
            raise InputError("the target settings (--target-column, --target-rule, --target-coverage) need "
                             "`--target` (a data file of examples to aim the selection at).")
        return None
    try:
        check_target_combination(config)
    except ValueError as error:
        raise InputError(str(error)) from None
    rows = load_rows(args.target, "train", option="--target")
    if column is not None and column not in rows.column_names:
        raise InputError(f"`--target-column` {column!r} is not a column of `--target` (columns: {rows.column_names}).")
    if column is not None and any(value is None for value in rows[column]):
        raise InputError(f"`--target-column` {column!r} has rows without a value: name the task of every row.")
    names, tasks = np.unique([str(v) for v in rows[column]] if column else ["target"] * len(rows),
                             return_inverse=True)
    if column is not None and names.size < 2:
        raise InputError(f"`--target-column` {column!r} has one value ({str(names[0])!r}): drop it for one target "
                         "task.")
    wanted = [c for c in (args.text_column, args.prompt_column, args.completion_column, args.messages_column) if c]
    if [c for c in wanted if c not in rows.column_names]:
        raise InputError(f"`--target` {args.target!r} is not in the dataset's format: it lacks the column(s) "
                         f"{[c for c in wanted if c not in rows.column_names]} (the target file's columns: "
                         f"{rows.column_names}).")
    try:
        check_budget(config, n_examples, names.size)
    except ValueError as error:
        raise InputError(str(error)) from None
    examples, _ = tokenize(rows, tokenizer, args)
    lengths = np.asarray([len(e["input_ids"]) for e in examples])
    return TargetSet(dataset=examples, lengths=tuple(int(n) for n in lengths), tasks=tasks.reshape(-1).astype(np.int64),
                     task_names=tuple(str(n) for n in names), source=args.target,
                     fingerprint=data_fingerprint(lengths, token_digest(datasets.Dataset.from_list(examples))))


def run_select(args: argparse.Namespace, config: ClusterSelectConfig) -> dict[str, Any]:
    """The `select` command: returns the summary it prints (also tested directly).

    Raises:
        InputError: for a bad option, data file, model or output folder (`check_inputs`, `load_rows`, `tokenize`),
            before the model loads.
    """
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .clock import PhaseClock
    from .collate import pad_collate
    from .data import has_replies, token_digest
    from .feature_cache import FeatureCache, feature_identity
    from .persistence import data_fingerprint, save_selection
    from .pipeline import select_with_model
    from .reporting.outputs import write_report_files
    from .reporting.report import SelectionReport
    from .run import resolve_run_facts

    check_inputs(args)
    rows = load_rows(args.dataset, args.split)
    taken = [name for name in OUTPUT_COLUMNS if name in rows.column_names]
    if taken:
        raise InputError(f"`--dataset` {args.dataset!r} already has the column(s) {taken} that `select` writes: rename "
                         f"or remove them (a previous selection's `dataset/`: `remove_columns({list(OUTPUT_COLUMNS)})`).")
    strata = _strata(rows, config.stratify_column)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except Exception as error:  # e.g. a tokenizer.model that needs sentencepiece
        raise InputError(f"`--model` {args.model!r}: its tokenizer does not load ({_cause(error)}).") from error
    examples, texts = tokenize(rows, tokenizer, args)  # bad columns fail before the model loads
    target = _target_set(args, config, tokenizer, len(examples))
    print(f"[1/4] data: {len(examples)} examples from {args.dataset}"
          + (f"; target: {len(target.lengths)} examples in {target.n_tasks} task(s) from {args.target}"
             if target else ""), flush=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if torch.cuda.is_available():
        model = model.cuda()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lengths = np.asarray([len(e["input_ids"]) for e in examples])
    digest = token_digest(datasets.Dataset.from_list(examples))
    fingerprint = data_fingerprint(lengths, digest)
    facts = resolve_run_facts(model, config, shift_labels=True, token_digest=digest, strata=strata,
                              replies=has_replies(examples))
    collate = functools.partial(pad_collate, pad_token_id=pad)
    identity = feature_identity(model, config, facts, data_fingerprint=fingerprint, collator=collate,
                                tokenizer=tokenizer, probe=examples) if config.feature_cache else None
    target_identity = feature_identity(model, config, facts, data_fingerprint=target.fingerprint, collator=collate,
                                       tokenizer=tokenizer, probe=target.dataset) if config.feature_cache and target \
        else None
    cache, clock = FeatureCache(), PhaseClock()
    print(f"[2/4] features ({facts.feature_used}) → clusters ({config.cluster_method}) → selection "
          f"({config.within_cluster})", flush=True)
    outcome = select_with_model(model, examples, collate, config=config, facts=facts, lengths=lengths, clock=clock,
                                batch_size=args.batch_size, identity=identity, cache=cache, target=target,
                                target_identity=target_identity)
    if outcome.features_from_cache:
        print(f"      features loaded from the feature cache {cache.directory}", flush=True)
    result, chosen, losses = outcome.clustering, outcome.selection, outcome.losses
    report = SelectionReport.build(result, chosen, config, lengths=lengths, loss_tokens=outcome.loss_tokens,
                                   clock=clock, features_from_cache=outcome.features_from_cache,
                                   feature_used=facts.feature_used, feature_map=outcome.feature_map,
                                   warmup_steps=0, warmup_seconds=0.0, target=outcome.target)  # no training: no warm-up
    features_seconds, clustering_seconds = report.features_seconds, report.clustering_seconds
    clusters = f"{result.n_clusters} cluster" + ("s" if result.n_clusters != 1 else "")
    print(f"[3/4] kept {chosen.n_kept} of {len(examples)} examples in {clusters} "
          f"(features {features_seconds:.1f} s, clustering and selection {clustering_seconds:.1f} s"
          + ("" if report.n_near_duplicate_rows is None else
             f"; {report.n_near_duplicate_rows} near-duplicate examples joined an earlier one, check "
             f"{report.near_duplicates_seconds or 0.0:.1f} s")
          + ("" if report.n_suspected_noise is None else f"; {report.n_suspected_noise} deferred as suspected noise")
          + ")", flush=True)
    print(f"[4/4] writing {args.output}", flush=True)
    os.makedirs(args.output, exist_ok=True)
    weights = np.zeros(len(examples))
    weights[chosen.indices] = chosen.weights
    kept = np.zeros(len(examples), dtype=bool)
    kept[chosen.indices] = True
    table = rows
    for name, values in zip(OUTPUT_COLUMNS, (result.labels, result.raw_labels, weights, kept)):
        table = table.add_column(name, values.tolist())
    table.save_to_disk(os.path.join(args.output, "dataset"))
    table.to_parquet(os.path.join(args.output, "selection.parquet"))
    write_report_files(args.output, report, base_model=None)
    save_selection(args.output, chosen, labels=result.labels, raw_labels=result.raw_labels, config=config.to_dict(),
                   fingerprint=fingerprint, extra={"report": report.to_dict()}, difficulty=outcome.difficulty)
    clusters = inspection(result, weights, kept, lengths, losses, texts,
                          relevance=(outcome.target or {}).get("cluster_relevance"))
    with open(os.path.join(args.output, "clusters.json"), "w", encoding="utf-8") as handle:
        json.dump(clusters, handle, indent=1)
    summary = {"n_examples": len(examples), "n_kept": chosen.n_kept, "n_clusters": result.n_clusters,
               "features_seconds": features_seconds, "clustering_seconds": clustering_seconds,
               "n_near_duplicate_rows": report.n_near_duplicate_rows, "n_suspected_noise": report.n_suspected_noise,
               "output": args.output}
    if outcome.target:
        summary["kept_per_target_task"] = dict(zip(outcome.target["task_names"], outcome.target["kept_per_task"]))
    print(json.dumps(summary), flush=True)
    return summary
