"""The inputs of `hf-cluster-select select`, checked before any feature work: options, model folder, output folder,
data files, and the rows tokenized for a causal LM (layer L5).

Every bad input is an `InputError` naming the option (and, for a bad value, the column and row), which the command
prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile

from .loss_tokens import IGNORE_INDEX

DATA_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt")  # one of them: a folder with a tokenizer


class InputError(ValueError):
    """A bad `select` input (option, data, model or output folder), found and named before any feature work."""


def error_cause(error: BaseException) -> str:
    """The innermost cause of `error` (libraries wrap theirs) as `Type: first line`, at most 200 characters."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__


def check_inputs(args: argparse.Namespace) -> None:
    """The checks `select` makes before it reads a row or loads a model: `--max-length` and `--batch-size` >= 1, a
    `--model` folder with `config.json`, tokenizer files and weights, of a causal LM, and an `--output` folder that
    is not a file, is neither an input nor holds one, is empty unless `--overwrite`, and can be written (it is
    created here, and a temporary file in it).

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
    if not any(name.endswith((".safetensors", ".bin", ".index.json")) for name in os.listdir(args.model)):
        raise InputError(f"`--model` {args.model!r} has no weights (no *.safetensors or pytorch_model*.bin): save the "
                         f"model there with `model.save_pretrained(folder)`.")
    _check_causal_lm(args.model)
    output = args.output
    if os.path.exists(output) and not os.path.isdir(output):
        raise InputError(f"`--output` {output!r} is a file, not a folder.")
    folder = os.path.realpath(output)
    inputs = [os.path.realpath(p) for p in (args.model, args.dataset, getattr(args, "target", None)) if p]
    if any(p == folder or p.startswith(os.path.join(folder, "")) for p in inputs):
        raise InputError(f"`--output` {output!r} is or holds an input of the command: choose another folder.")
    try:
        if os.path.isdir(output) and os.listdir(output) and not getattr(args, "overwrite", False):
            raise InputError(f"`--output` {output!r} is not empty: pass `--overwrite` to write into it (files of the "
                             f"same name are replaced) or choose a new folder.")
        os.makedirs(output, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as error:
        raise InputError(f"`--output` {output!r} cannot be written ({error_cause(error)}).") from None


OUTPUT_COLUMNS = ("cluster_id", "raw_cluster_id", "weight", "kept")  # what `run_select` adds to the user's rows


def _check_causal_lm(model: str) -> None:
    """An `InputError` if the folder's config names architectures and none is a causal language model (a saved
    `BertForSequenceClassification` would load as a causal LM with a new, untrained head and select silently)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        architectures = AutoConfig.from_pretrained(model).architectures or []
    except Exception as error:
        raise InputError(f"`--model` {model!r}: its config.json does not load ({error_cause(error)}).") from error
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
        raise InputError(f"`{option}` {path!r} cannot be read as {what} ({error_cause(error)}).") from error
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


def strata_values(rows, column: str | None) -> list | None:
    """The `--stratify-column` value of every row (`None` without one).

    Raises:
        InputError: if the dataset has no such column or a row has no value in it.
    """
    if column is None:
        return None
    if column not in rows.column_names:
        raise InputError(f"`--stratify-column` {column!r} is not a column of the dataset (columns: "
                         f"{rows.column_names}).")
    values = list(rows[column])
    if None in values:
        raise InputError(f"`--stratify-column` {column!r} has no value in row {values.index(None)}: give every row "
                         "its stratum.")
    return values


def _row(index: int, where: str) -> str:
    """`row 3`, or `row 3 of `--target`` for a row of another file than `--dataset` (rows counted from 0)."""
    return f"row {index}" + ("" if where == "--dataset" else f" of `{where}`")


def _text(row: dict, column: str, option: str, index: int, where: str = "--dataset") -> str:
    """`row[column]` if it is a string; else an `InputError` naming the option, the column and the row (a null reply
    or a number would otherwise be trained on as the text "None" or "3")."""
    value = row[column]
    if not isinstance(value, str):
        raise InputError(f"`{option}` {column!r} must hold text, got {type(value).__name__} {value!r} in "
                         f"{_row(index, where)}.")
    return value


def _messages(row: dict, column: str, index: int, where: str = "--dataset") -> tuple[list, str]:
    """`(messages, last message's content)` of `row[column]`; an `InputError` naming --messages-column, the column
    and the row unless it is a non-empty list of dicts with string "content" whose last is not a user or system turn
    (the last message is the reply the loss is on)."""
    messages = row[column]
    if not isinstance(messages, list) or not messages or any(
            not isinstance(m, dict) or not isinstance(m.get("content"), str) for m in messages) \
            or messages[-1].get("role") in ("user", "system"):
        raise InputError(f"`--messages-column` {column!r} must hold a non-empty list of messages, each a dict with text "
                         f"\"content\", the last the reply (not a user or system turn), got {messages!r} in "
                         f"{_row(index, where)}.")
    return messages, messages[-1]["content"]


def tokenize(rows, tokenizer, args: argparse.Namespace, where: str = "--dataset") -> tuple[list[dict], list[str]]:
    """Tokenized examples (`input_ids`, `attention_mask`, `labels`, -100 where no loss) and a text per example;
    `where` names the file in errors (`--dataset` or `--target`).

    Raises:
        InputError: unless exactly one of --text-column, --prompt-column + --completion-column, --messages-column
            is given and names a column of the dataset; if a text, prompt or completion value is not a string, a
            messages value is not a non-empty list of messages with string "content" ending with the reply, or
            --messages-column is given with a tokenizer that has no chat template.
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
    if args.messages_column and getattr(tokenizer, "chat_template", None) is None:
        raise InputError(f"`--messages-column` needs a tokenizer with a chat template; the one in `--model` "
                         f"{getattr(args, 'model', '')!r} has none (set `tokenizer.chat_template` and save it, or give "
                         "--prompt-column and --completion-column).")
    examples, texts = [], []
    for index, row in enumerate(rows):
        if args.text_column:
            prompt, answer = "", _text(row, args.text_column, "--text-column", index, where)
        elif args.prompt_column:
            prompt = _text(row, args.prompt_column, "--prompt-column", index, where)
            answer = _text(row, args.completion_column, "--completion-column", index, where)
        else:
            messages, answer = _messages(row, args.messages_column, index, where)
            prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True) \
                if len(messages) > 1 else ""
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
