"""`hf-cluster-select select`: a selection without training, written for inspection and reuse (layer L5).

Reads a dataset, tokenizes it for a causal LM (loss on the text, the completion, or the last message of a chat),
computes the configured learning-effect features with the model as it is (no warm-up: there is no training run),
clusters, selects, and writes the outputs described in `commands.py`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from typing import Any

import numpy as np

from .config import ClusterSelectConfig
from .select_inputs import (OUTPUT_COLUMNS, InputError, check_inputs, error_cause, load_rows, strata_values,
                            tokenize)

__all__ = ["InputError", "run_select"]

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
    examples, _ = tokenize(rows, tokenizer, args, where="--target")
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
    strata = strata_values(rows, config.stratify_column)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except Exception as error:  # e.g. a tokenizer.model that needs sentencepiece
        raise InputError(f"`--model` {args.model!r}: its tokenizer does not load ({error_cause(error)}).") from error
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
