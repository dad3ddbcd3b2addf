"""MathQA for the demo: loading, chat-format tokenization with prompt-masked labels, and multiple-choice accuracy
(padding is `hf_cluster_select.collate.pad_collate`, re-exported here).

Data: BIG-bench `elementary_math_qa.question_with_mathematical_hint` (7,688 MathQA problems, Amini et al.,
NAACL 2019), shipped in `hf_cluster_select/demo/data/` (see its NOTICE.md). Each file example is the question, a
newline, and the annotated solution program (`divide(90, subtract(1, divide(2, 3)))`), plus `{option: 0/1}`.

`load_mathqa` separates the question from the program: the program spells out the computation that yields the
answer, so a prompt that contains it turns the task into arithmetic evaluation. Prompts leave it out unless
`with_program=True`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections.abc import Sequence
from typing import Any

from ..collate import pad_collate  # noqa: F401  (re-exported: `demo.pad_collate`)
from ..loss_tokens import IGNORE_INDEX

logger = logging.getLogger(__name__)

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
MATHQA_FILE = os.path.join(DATA_DIR, "elementary_math_qa.question_with_mathematical_hint.json")
SYSTEM_PROMPT = "Pick the correct option."  # short: the chat template adds ~10 tokens around it


def _clean_options(target_scores: dict[str, int]) -> tuple[list[str], int]:
    """Options in file order and the index of the correct one.

    145 examples were stored from a stringified Python list, e.g. keys `"[' 16'"`, `"' 48'"`, ..., `"' 8']"`, and one
    option `' $ 1,920'` was split at its comma into `"' $ 1"` and `"920']"`. Glue such pieces back and strip the list
    syntax; every other option is kept as it is (whitespace-stripped).
    """
    keys = list(target_scores)
    scores = [target_scores[key] for key in keys]
    if not keys[0].startswith("['"):
        options = [key.strip() for key in keys]
        return options, scores.index(1)
    options, correct, piece, piece_score = [], None, "", 0
    for key, score in zip(keys, scores):
        piece = f"{piece},{key}" if piece else key
        piece_score = max(piece_score, score)
        if piece.endswith(("'", "']")):  # the closing quote ends one option
            text = piece.lstrip("[").rstrip("]").strip()
            options.append(
                text[1:-1].strip() if text.startswith("'") and text.endswith("'") else text.strip("'").strip()
            )
            if piece_score:
                correct = len(options) - 1
            piece, piece_score = "", 0
    if piece or correct is None:
        raise ValueError(f"Cannot parse MathQA options {keys!r}")
    return options, correct


def load_mathqa(n: int | None = None, seed: int = 0):
    """Load the shipped MathQA problems as a `datasets.Dataset`.

    Args:
        n (`int`, *optional*): number of problems to sample (without replacement, seeded); all 7,688 when `None`.
        seed (`int`, *optional*, defaults to `0`): seed of the sample. The sample is returned in file order.
    Returns:
        `datasets.Dataset` with columns `source_index` (`int`, row in the file), `question` (`str`, without the
        program line), `program` (`str`, the annotated solution program), `options` (`list[str]`, in file order:
        7,500 problems have 5 options, the others 3-10), `answer_index` (`int`), `answer` (`str`, the correct option).
        The data has no free-text rationale; `program` is the only worked solution.
    Raises:
        ValueError: if `n` is not in [1, 7688].
    """
    import datasets

    with open(MATHQA_FILE, encoding="utf-8") as handle:
        examples = json.load(handle)["examples"]
    if n is not None and not 1 <= n <= len(examples):
        raise ValueError(f"`n` must be in [1, {len(examples)}], got {n}")
    indices = list(range(len(examples))) if n is None else sorted(random.Random(seed).sample(range(len(examples)), n))
    columns: dict[str, list[Any]] = {
        key: [] for key in ("source_index", "question", "program", "options", "answer_index", "answer")
    }
    for index in indices:
        example = examples[index]
        question, _, program = example["input"].rpartition("\n")
        options, answer_index = _clean_options(example["target_scores"])
        columns["source_index"].append(index)
        columns["question"].append(question.strip())
        columns["program"].append(program.strip())
        columns["options"].append(options)
        columns["answer_index"].append(answer_index)
        columns["answer"].append(options[answer_index])
    return datasets.Dataset.from_dict(columns)


def mathqa_messages(question: str, options: Sequence[str], program: str | None = None) -> list[dict[str, str]]:
    """Chat messages (system + user) for one problem; the assistant's reply is the correct option's text."""
    user = f"{question}\nOptions: {' | '.join(options)}"
    if program:
        user += f"\nHint: {program}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _prompt_ids(tokenizer, example: dict, with_program: bool) -> list[int]:
    messages = mathqa_messages(example["question"], example["options"], example["program"] if with_program else None)
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def _answer_ids(tokenizer, text: str) -> list[int]:
    """The reply's tokens plus EOS (`<|im_end|>` for SmolLM2): exactly what carries the loss."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no `eos_token_id`; the reply must end with one")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def tokenize_mathqa(dataset, tokenizer, max_length: int = 128, with_program: bool = False, overflow: str = "truncate"):
    """Tokenize problems for causal-LM fine-tuning with the loss on the reply only.

    Each sequence is the chat-formatted prompt (system + question + options, via the tokenizer's chat template, ending
    with the assistant header) followed by the correct option's text and EOS. Labels copy `input_ids` on the reply
    tokens, EOS included, and are `-100` on the prompt; they are built here, not derived from the pad token, so EOS
    keeps its label even where pad == EOS (SmolLM2).

    Sequences longer than `max_length` are cut from the right (the EOS and then reply tokens go first) with
    `overflow="truncate"`; a problem whose prompt alone fills `max_length` would keep no labelled token and is
    dropped. `overflow="drop"` drops every problem that does not fit whole instead (no reply is ever cut, so every
    kept sequence ends with a labelled EOS). The number dropped is `len(dataset) - len(result)` (rows are never
    reordered) and is logged as a warning. Under the SmolLM2 tokenizer without the program, 5.7% of the 7,688
    problems exceed 128 tokens (median 89, 95th percentile 130); 359 have prompts of 128 tokens or more.

    Args:
        dataset (`datasets.Dataset`): from `load_mathqa` (needs `question`, `options`, `answer`, and `program` if
            `with_program`).
        tokenizer (`PreTrainedTokenizerBase`): with a chat template and an EOS token.
        max_length (`int`, *optional*, defaults to `128`): most tokens per sequence.
        with_program (`bool`, *optional*, defaults to `False`): add the solution program to the prompt as a hint.
        overflow (`str`, *optional*, defaults to `"truncate"`): `"truncate"` or `"drop"`, for sequences longer than
            `max_length`.
    Returns:
        `datasets.Dataset` with only `input_ids`, `attention_mask` (all ones) and `labels` (`list[int]`, same length
        as `input_ids`, at most `max_length`; at least one label is not `-100`).
    Raises:
        ValueError: if `max_length < 2`, `overflow` is not one of the two choices, or the tokenizer has no EOS token.
    """
    if max_length < 2:
        raise ValueError(f"`max_length` must be at least 2, got {max_length}")
    if overflow not in ("truncate", "drop"):
        raise ValueError(f"`overflow` must be 'truncate' or 'drop', got {overflow!r}")

    def encode(example: dict) -> dict:
        prompt = _prompt_ids(tokenizer, example, with_program)
        reply = _answer_ids(tokenizer, example["answer"])
        if overflow == "drop" and len(prompt) + len(reply) > max_length:
            prompt, reply = prompt[:max_length], []  # marked for dropping: no labelled token
        input_ids = (prompt + reply)[:max_length]
        labels = ([IGNORE_INDEX] * len(prompt) + reply)[:max_length]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    encoded = dataset.map(encode, remove_columns=dataset.column_names, desc="Tokenizing MathQA")
    kept = encoded.filter(lambda labels: any(label != IGNORE_INDEX for label in labels), input_columns="labels")
    if len(kept) < len(encoded):
        logger.warning(
            "tokenize_mathqa: dropped %d of %d problems that do not fit max_length=%d",
            len(encoded) - len(kept),
            len(encoded),
            max_length,
        )
    return kept


def split_train_eval(dataset, eval_size: float, seed: int = 0):
    """Seeded split into `(train, eval)`.

    Args:
        dataset (`datasets.Dataset`): any dataset.
        eval_size (`int` or `float`): number of eval rows, or a fraction in (0, 1).
        seed (`int`, *optional*, defaults to `0`): shuffling seed.
    Returns:
        `tuple[datasets.Dataset, datasets.Dataset]`: disjoint train and eval sets covering `dataset`.
    Raises:
        ValueError: if `eval_size` leaves either side empty.
    """
    count = round(eval_size * len(dataset)) if isinstance(eval_size, float) else int(eval_size)
    if not 1 <= count < len(dataset):
        raise ValueError(f"`eval_size` must leave both sides non-empty for {len(dataset)} rows, got {eval_size}")
    split = dataset.train_test_split(test_size=count, seed=seed, shuffle=True)
    return split["train"], split["test"]


def multiple_choice_accuracy(
    model,
    tokenizer,
    dataset,
    batch_size: int = 8,
    with_program: bool = False,
    length_normalize: bool = True,
) -> dict:
    """Zero-shot (or post-training) multiple-choice accuracy on MathQA by option log-likelihood.

    Each option is scored by the model's log-probability of its text followed by EOS, as the assistant's reply to the
    prompt `tokenize_mathqa` uses; the prediction is the best-scoring option. Including EOS stops a prefix option
    (`"1"`) from winning over a longer one (`"12"`). With `length_normalize=True` (the default) the score is the mean
    log-probability per reply token, so options that tokenize into more pieces are not penalised; the summed score's
    accuracy is returned too. Each prompt is run once: its KV cache is copied to all of its options.

    Args:
        model (`PreTrainedModel`): a causal LM (a PEFT-wrapped one works too); run in eval mode, then restored.
        tokenizer (`PreTrainedTokenizerBase`): the model's tokenizer, with chat template and EOS.
        dataset (`datasets.Dataset`): from `load_mathqa`.
        batch_size (`int`, *optional*, defaults to `8`): problems per forward pass (all of their options together).
        with_program (`bool`, *optional*, defaults to `False`): include the program hint, as in training.
        length_normalize (`bool`, *optional*, defaults to `True`): rank by mean (`True`) or summed log-probability.
    Returns:
        `dict`: `accuracy` (float in [0, 1], by the chosen score), `accuracy_sum` and `accuracy_mean` (both
        scores), `n` (problems scored), `accuracy_chance` (mean of 1/number of options, about 0.2) and
        `accuracy_seconds` (wall time); the key names are distinct so the dict can be merged into other metrics.
    """
    import time

    import torch

    start = time.perf_counter()
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    correct_mean = correct_sum = 0
    chance = 0.0
    try:
        with torch.inference_mode():
            for begin in range(0, len(dataset), batch_size):
                rows = dataset.select(range(begin, min(begin + batch_size, len(dataset))))
                prompts = [_prompt_ids(tokenizer, row, with_program) for row in rows]
                replies = [[_answer_ids(tokenizer, option) for option in row["options"]] for row in rows]
                sums, means = _score_options(model, prompts, replies, pad_id, device)
                for row, option_sums, option_means in zip(rows, sums, means):
                    correct_sum += int(
                        max(range(len(option_sums)), key=option_sums.__getitem__) == row["answer_index"]
                    )
                    correct_mean += int(
                        max(range(len(option_means)), key=option_means.__getitem__) == row["answer_index"]
                    )
                    chance += 1.0 / len(row["options"])
    finally:
        model.train(was_training)
    n = len(dataset)
    accuracy_mean = correct_mean / n if n else math.nan
    accuracy_sum = correct_sum / n if n else math.nan
    return {
        "accuracy": accuracy_mean if length_normalize else accuracy_sum,
        "accuracy_mean": accuracy_mean,
        "accuracy_sum": accuracy_sum,
        "n": n,
        "accuracy_chance": chance / n if n else math.nan,
        "accuracy_seconds": time.perf_counter() - start,
    }


def _cache_kwarg(model) -> str:
    """`cache` (transformers >= 5.2x) or `past_key_values` (older), read from the base model's forward signature."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _score_options(
    model, prompts: list[list[int]], replies: list[list[list[int]]], pad_id: int, device
) -> tuple[list[list[float]], list[list[float]]]:
    """Summed and mean log-probabilities of each reply given its prompt (one prompt pass, cache copied per option).

    Prompts are left-padded so they all end at the same position; replies are right-padded after them.
    """
    import torch

    n_prompts, prompt_len = len(prompts), max(len(prompt) for prompt in prompts)
    prompt_ids = torch.full((n_prompts, prompt_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n_prompts, prompt_len), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, prompt_len - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[row, prompt_len - len(prompt) :] = 1
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache_kwarg = _cache_kwarg(model)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=prompt_positions,
        use_cache=True,
        logits_to_keep=1,
    )
    first_logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [n_prompts, vocab]: predicts reply token 0

    owner = [row for row, options in enumerate(replies) for _ in options]
    flat = [reply for options in replies for reply in options]
    reply_len = max(len(reply) for reply in flat)
    reply_ids = torch.full((len(flat), reply_len), pad_id, dtype=torch.long)
    reply_mask = torch.zeros((len(flat), reply_len), dtype=torch.long)
    for row, reply in enumerate(flat):
        reply_ids[row, : len(reply)] = torch.tensor(reply)
        reply_mask[row, : len(reply)] = 1
    owner_index = torch.tensor(owner, device=device)
    reply_ids, reply_mask = reply_ids.to(device), reply_mask.to(device)
    cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
    cache.reorder_cache(owner_index)  # one copy of the prompt's keys/values per option
    full_mask = torch.cat([prompt_mask.index_select(0, owner_index), reply_mask], dim=1)
    positions = (
        prompt_mask.sum(-1).index_select(0, owner_index)[:, None] + torch.arange(reply_len, device=device)[None, :]
    )
    logits = model(
        input_ids=reply_ids, attention_mask=full_mask, position_ids=positions, use_cache=True, **{cache_kwarg: cache}
    ).logits
    # token t of a reply is predicted by the prompt's last position (t = 0) or by reply position t - 1
    token_logprobs = torch.empty(reply_ids.shape, dtype=torch.float32, device=device)
    token_logprobs[:, 0] = first_logprobs.index_select(0, owner_index).gather(1, reply_ids[:, :1]).squeeze(1)
    if reply_len > 1:
        step_logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        token_logprobs[:, 1:] = step_logprobs.gather(2, reply_ids[:, 1:, None]).squeeze(2)
    token_logprobs = token_logprobs * reply_mask
    sums = token_logprobs.sum(-1)
    means = sums / reply_mask.sum(-1)
    sums_out: list[list[float]] = [[] for _ in prompts]
    means_out: list[list[float]] = [[] for _ in prompts]
    for row, owner_row in enumerate(owner):
        sums_out[owner_row].append(float(sums[row]))
        means_out[owner_row].append(float(means[row]))
    return sums_out, means_out
