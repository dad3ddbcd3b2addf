"""Noisy and redundant pools for `benchmarks/quality.py`: a clean task's training pool corrupted, its test set kept.

Built offline and deterministically (seeded by `quality_tasks.POOL_SEED`) from the data the clean task already ships:
- `label_noise` (share 0-1 of the pool's rows): on a classification task each chosen row's label is replaced by
  another class drawn uniformly; on an SFT task (loss only on the reply) each chosen row's reply (its loss-bearing
  tokens) is swapped for the reply of a random row of another group (skill), so the prompt asks for one skill and the
  target answers another (the noise model of instruction-tuning pools that AlpaGasus, arXiv 2307.08701, filters).
- `duplicates` (extra rows as a share 0-1 of the pool): copies of rows drawn from a *source set* of
  `DUPLICATE_SOURCES` of the pool (redundancy concentrated on a few examples, as templated or scraped data repeats),
  half exact, half near duplicates with `NEAR_DUPLICATE_TOKENS` prompt tokens replaced by tokens drawn from the pool
  (SemDeDup, arXiv 2303.09540, removes both kinds). Copies are appended after the original rows.
- both (`<name>_dup<pct>_noise<pct>`): the copies are made first, then the labels / replies of the whole pool, copies
  included, replaced, so some copies disagree with their source (the same text labelled twice, differently).

The test set stays clean; `groups_train` follows the rows (a copy keeps its source's group, a noisy row its skill or,
on a classification task, its new label); `Task.corrupted` marks the rows whose label/reply was replaced and the
appended copies (`quality.py` reports their share among the kept rows).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from quality_tasks import POOL_SEED, Task

DUPLICATE_SOURCES = 0.1  # share of the pool that the duplicates copy
NEAR_DUPLICATE_TOKENS = 3  # tokens replaced in a near duplicate
IGNORE_INDEX = -100


def _rows(dataset) -> list[dict]:
    return [dict(dataset[i]) for i in range(len(dataset))]


def _is_sft(rows: list[dict]) -> bool:
    return isinstance(rows[0]["labels"], list)


def _swap_replies(rows: list[dict], groups: np.ndarray, share: float, rng: np.random.Generator) -> list[dict]:
    """Each chosen row keeps its prompt and takes the reply (loss-bearing tail) of a random row of another group."""
    chosen = rng.choice(len(rows), size=round(share * len(rows)), replace=False)
    out = [dict(r) for r in rows]
    for i in chosen:
        donors = np.flatnonzero(groups != groups[i])
        donor = rows[int(rng.choice(donors))]
        n_prompt = sum(1 for t in rows[i]["labels"] if t == IGNORE_INDEX)
        reply = [t for t in donor["labels"] if t != IGNORE_INDEX]
        prompt = rows[i]["input_ids"][:n_prompt]
        out[i] = {**rows[i], "input_ids": prompt + reply, "labels": [IGNORE_INDEX] * n_prompt + reply,
                  "attention_mask": [1] * (n_prompt + len(reply))}
    return out


def _flip_labels(rows: list[dict], n_classes: int, share: float, rng: np.random.Generator) -> list[dict]:
    """Each chosen row's label becomes another class, drawn uniformly."""
    chosen = rng.choice(len(rows), size=round(share * len(rows)), replace=False)
    out = [dict(r) for r in rows]
    for i in chosen:
        out[i]["labels"] = int((rows[i]["labels"] + rng.integers(1, n_classes)) % n_classes)
    return out


def _duplicate(rows: list[dict], share: float, rng: np.random.Generator) -> tuple[list[dict], np.ndarray]:
    """`round(share·n)` copies of rows from a seeded source set; every second one a near duplicate. Returns the
    copies and their sources."""
    n = len(rows)
    sources = rng.choice(n, size=max(1, round(DUPLICATE_SOURCES * n)), replace=False)
    picks = rng.choice(sources, size=round(share * n), replace=True)
    vocabulary = np.concatenate([np.asarray(r["input_ids"]) for r in rows])
    sft = _is_sft(rows)
    copies = []
    for k, source in enumerate(picks):
        row = {key: (list(value) if isinstance(value, list) else value) for key, value in rows[int(source)].items()}
        if k % 2:  # near duplicate: a few prompt tokens replaced (never the reply, nor [CLS]/[SEP])
            if sft:
                editable = [p for p, t in enumerate(row["labels"]) if t == IGNORE_INDEX]
            else:
                editable = list(range(1, len(row["input_ids"]) - 1))
            for p in rng.choice(editable, size=min(NEAR_DUPLICATE_TOKENS, len(editable)), replace=False):
                row["input_ids"][int(p)] = int(rng.choice(vocabulary))
        copies.append(row)
    return copies, picks


def corrupted(task: Task, label_noise: float = 0.0, duplicates: float = 0.0) -> Task:
    """`task` with its training pool corrupted as the module docstring says; the test set and recipe unchanged.

    Args:
        task (`Task`): a clean task of `quality_tasks` (classification: int `labels`; SFT: token `labels`).
        label_noise (`float`): share of rows (0-1) whose label / reply is replaced.
        duplicates (`float`): extra rows (share 0-1 of the pool) that copy rows of the source set.
    Returns:
        `Task` named `<name>_noise<pct>` / `<name>_dup<pct>` / `<name>_dup<pct>_noise<pct>`.
    """
    from datasets import Dataset

    rng = np.random.default_rng([POOL_SEED, round(100 * label_noise), round(100 * duplicates)])
    rows, groups = _rows(task.train), np.asarray(task.groups_train)
    changed = np.zeros(len(rows), dtype=bool)

    def add_noise(rows, groups, changed):
        clean = rows
        if _is_sft(rows):
            rows = _swap_replies(rows, groups, label_noise, rng)
        else:
            rows = _flip_labels(rows, task.n_groups, label_noise, rng)
            groups = np.asarray([r["labels"] for r in rows])
        return rows, groups, changed | np.array([a["labels"] != b["labels"] for a, b in zip(rows, clean)])

    def add_copies(rows, groups, changed):
        copies, sources = _duplicate(rows, duplicates, rng)
        return (rows + copies, np.concatenate([groups, groups[sources]]),
                np.concatenate([changed, np.ones(len(copies), dtype=bool)]))

    if label_noise and duplicates:  # copies first: a copy's label / reply may then be replaced (annotators disagree)
        rows, groups, changed = add_noise(*add_copies(rows, groups, changed))
        name = f"{task.name}_dup{round(100 * duplicates)}_noise{round(100 * label_noise)}"
    else:
        if label_noise:
            rows, groups, changed = add_noise(rows, groups, changed)
        if duplicates:
            rows, groups, changed = add_copies(rows, groups, changed)
        name = task.name + (f"_noise{round(100 * label_noise)}" if label_noise else "") + (
            f"_dup{round(100 * duplicates)}" if duplicates else "")
    return dataclasses.replace(task, name=name, train=Dataset.from_list(rows), groups_train=groups, corrupted=changed)
