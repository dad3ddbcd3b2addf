"""Reliability (issue 5), in-process: bad input fails before any model work with a clear message; degenerate features
(NaN/inf, constant, duplicates, one example, fewer than min_cluster_size, no loss-bearing tokens) are handled by the
documented policy; a broken hdbscan fails early with its fix; artefacts are written atomically and an incomplete
checkpoint is never resumed from. Subprocess kills and offline runs: test_persistence_interrupt.py. Invariants over
random inputs: test_properties.py."""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np
import pytest
from tiny_assets import hdbscan_config
import torch
from sklearn.metrics import adjusted_rand_score
from transformers import DataCollatorWithPadding, TrainingArguments

from hf_cluster_select.features import FEATURES
from hf_cluster_select import ClusterSelectConfig, ClusterTrainer, SelectionReport
from hf_cluster_select._types import NO_LOSS_LABEL, NONFINITE_LABEL, Selection
from hf_cluster_select.selection import cluster_features
from hf_cluster_select.features import FeatureOutput
from hf_cluster_select.reporting.model_card import write_model_card
from hf_cluster_select.persistence import (
    SELECTION_FILENAME, checkpoint_problems, load_selection, resolve_resume_checkpoint, save_selection,
)
from hf_cluster_select.reporting.plots import plot_cluster_sizes
from hf_cluster_select.schedule import plan_steps
from hf_cluster_select.selection import select_from_labels, select_subset
from hf_cluster_select.validation import check_loss_tokens


def make_args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
        num_train_epochs=1, learning_rate=1e-3, warmup_steps=2, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True,
    )
    values.update(overrides)
    return TrainingArguments(**values)


def build(tmp_path, model, dataset, collator, config=None, **overrides):
    return ClusterTrainer(
        model=model, args=make_args(tmp_path, **overrides), train_dataset=dataset, data_collator=collator,
        cluster_config=config or hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=5),
    )


def fails_before_model_work(trainer, error=ValueError):
    """Call `train()`, expect `error`; assert no forward pass ran, no weight changed, nothing was written."""
    forwards = []
    handle = trainer.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    try:
        with pytest.raises(error) as info:
            trainer.train()
    finally:
        handle.remove()
    assert forwards == [] and trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert not os.path.exists(os.path.join(trainer.args.output_dir, "selection_report.json"))
    return str(info.value)


# ---- 1. input validation before any model work ------------------------------------------------------------------
def test_empty_dataset(tmp_path, tiny_lm, lm_dataset, collator):
    message = fails_before_model_work(build(tmp_path, tiny_lm, lm_dataset.select([]), collator))
    assert message == "`train_dataset` is empty."


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield {"input_ids": [1, 2, 3]}


@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_streaming_dataset_is_rejected(tmp_path, tiny_lm, lm_dataset, collator, kind):
    stream = lm_dataset.to_iterable_dataset() if kind == "datasets" else Stream()
    with pytest.raises(ValueError) as info:  # at construction, before Trainer asks for `max_steps`
        build(tmp_path, tiny_lm, stream, collator)
    name = "IterableDataset" if kind == "datasets" else "Stream"
    assert str(info.value) == (
        f"`train_dataset` must be a map-style dataset with `__len__` (selection needs to see every example), got "
        f"{name}; materialise a streaming dataset first (e.g. `Dataset.from_generator`)."
    )


def test_dataset_dict_is_rejected(tmp_path, tiny_lm, lm_dataset, collator):
    from datasets import DatasetDict

    with pytest.raises(ValueError) as info:
        build(tmp_path, tiny_lm, DatasetDict(train=lm_dataset), collator)
    assert str(info.value) == "`train_dataset` is a dict of splits (['train']); pass one split, e.g. dataset['train']."


@pytest.mark.parametrize("fraction", [0, 0.0, -0.1, 1.5, float("nan")])
def test_data_fraction_out_of_range(tmp_path, tiny_lm, lm_dataset, collator, fraction):
    with pytest.raises(ValueError) as info:
        hdbscan_config(data_fraction=fraction)
    assert str(info.value) == f"`data_fraction` must be in (0, 1], got {float(fraction)}."
    config = hdbscan_config()
    config.data_fraction = fraction  # changed after validation: plan() still refuses it
    message = fails_before_model_work(build(tmp_path, tiny_lm, lm_dataset, collator, config=config))
    assert message == f"`data_fraction` must be in (0, 1], got {fraction!r}."


def test_subset_smaller_than_one_global_batch(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, config=hdbscan_config(data_fraction=0.3),
                    per_device_train_batch_size=8, gradient_accumulation_steps=4)
    assert fails_before_model_work(trainer) == (
        "the selected subset would hold 29 examples, fewer than one global batch of 32 (world_size 1 × "
        "per_device_train_batch_size 8 × gradient_accumulation_steps 4); raise `data_fraction` or lower the batch."
    )
    with pytest.raises(ValueError) as info:  # the world size counts too (2 ranks × 4 × 4)
        plan_steps(n_examples=96, n_kept=29, world_size=2, per_device_batch_size=4, gradient_accumulation_steps=4,
                   warmup_steps=0, num_train_epochs=1)
    assert "fewer than one global batch of 32 (world_size 2 × per_device_train_batch_size 4 × " in str(info.value)


def test_dataset_smaller_than_one_global_batch(tmp_path, tiny_lm, lm_dataset, collator):
    trainer = build(tmp_path, tiny_lm, lm_dataset.select(range(6)), collator, per_device_train_batch_size=8)
    assert fails_before_model_work(trainer) == (
        "the training dataset has 6 examples, fewer than one global batch of 8 (world_size 1 × "
        "per_device_train_batch_size 8 × gradient_accumulation_steps 1); use a smaller batch or more data."
    )


def test_warmup_not_below_planned_steps(tmp_path, tiny_lm, lm_dataset, collator):
    # 96 examples, batch 4: 24 full-data steps per epoch
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, config=hdbscan_config(data_fraction=0.5,
                                                                                       selection_warmup_steps=24))
    assert fails_before_model_work(trainer) == (
        "`warmup_steps` (24) must be smaller than the 24 steps the run would take on the full data (1 epochs); "
        "lower the warm-up (ClusterSelectConfig.selection_warmup_steps, or TrainingArguments.warmup_steps when that is "
        "None)."
    )
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator, max_steps=5, warmup_steps=5)  # the LR warm-up
    assert fails_before_model_work(trainer) == (
        "`warmup_steps` (5) must be smaller than the planned total of 5 steps (`max_steps`); lower the warm-up "
        "(ClusterSelectConfig.selection_warmup_steps, or TrainingArguments.warmup_steps when that is None) or raise "
        "`max_steps`."
    )


def test_untokenized_dataset_names_the_columns(tmp_path, tiny_lm, collator):
    from datasets import Dataset

    text = Dataset.from_dict({"text": ["add two numbers"] * 8, "id": list(range(8))})
    message = fails_before_model_work(build(tmp_path, tiny_lm, text, collator))
    assert message == "`train_dataset` has no 'input_ids' column (columns found: ['id', 'text']); tokenize it first."
    strings = ["add two numbers"] * 8
    message = fails_before_model_work(build(tmp_path, tiny_lm, strings, collator))
    assert message == (
        "example 0 of `train_dataset` is a str, not a dict of features with a 'input_ids' entry; tokenize the data "
        "first (e.g. `datasets.Dataset.map(tokenize)`)."
    )


def test_collator_needing_a_missing_column(tmp_path, tiny_lm, lm_dataset, collator):
    def needs_weights(examples):
        return {"input_ids": torch.tensor([e["input_ids"][:2] for e in examples]),
                "sample_weight": torch.tensor([e["weight"] for e in examples])}

    trainer = build(tmp_path, tiny_lm, lm_dataset.remove_columns("labels").to_list(), needs_weights)
    assert fails_before_model_work(trainer) == (
        "the data collator (needs_weights) failed on the first 8 examples of `train_dataset` (columns found: "
        "['attention_mask', 'input_ids']): KeyError: 'weight'. Make sure the dataset is tokenized and has the "
        "columns this collator needs (e.g. `input_ids`)."
    )


def test_batches_without_labels(tmp_path, tiny_lm, lm_dataset, tokenizer):
    dataset = lm_dataset.remove_columns("labels")
    message = fails_before_model_work(build(tmp_path, tiny_lm, dataset, DataCollatorWithPadding(tokenizer)))
    assert message == (
        "the data collator's batches have none of ['labels'] (batch keys: ['attention_mask', 'input_ids']), so the "
        "model cannot compute a training loss. Add a `labels` column to `train_dataset`, or use a collator that "
        "makes labels (e.g. `DataCollatorForLanguageModeling(tokenizer, mlm=False)` for a causal LM)."
    )


def with_masked_labels(dataset, masked):
    from datasets import Dataset

    columns = dataset.to_dict()
    columns["labels"] = [[-100] * len(l) if i in masked else l for i, l in enumerate(columns["labels"])]
    return Dataset.from_dict(columns)


def test_no_loss_bearing_token_anywhere(tmp_path, tiny_lm, lm_dataset, collator):
    dataset = with_masked_labels(lm_dataset, set(range(96)))
    assert fails_before_model_work(build(tmp_path, tiny_lm, dataset, collator)) == (
        "none of the 96 examples of `train_dataset` has a loss-bearing token (every `labels` entry is -100 after "
        "the first): there is nothing to train on. Check the label masking (completion-only loss, `max_length` "
        "truncation cutting off every answer)."
    )
    with pytest.raises(ValueError, match="none of the 3 examples of `train_dataset` has a loss-bearing token after"):
        check_loss_tokens(np.zeros(3, dtype=np.int64))
    assert check_loss_tokens(np.array([0, 4, 0])) == 2


def test_some_examples_without_loss_bearing_tokens(tmp_path, tiny_lm, lm_dataset, collator, caplog):
    masked = set(range(0, 96, 8))  # 12 examples
    trainer = build(tmp_path, tiny_lm, with_masked_labels(lm_dataset, masked), collator, warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="hf_cluster_select.validation"):
        trainer.train()
    assert "12 of 96 examples of `train_dataset` have no loss-bearing token" in caplog.text
    report = trainer.selection_report
    assert report.n_no_loss_tokens == 12 and report.n_nonfinite_features == 0
    assert trainer.selection.n_kept == 48 and not masked & set(trainer.selection.indices.tolist())
    assert trainer.selection.weights.sum() == pytest.approx(96)
    assert (trainer.selection_run.raw_labels[sorted(masked)] == NO_LOSS_LABEL).all()
    assert trainer.state.global_step == trainer.step_plan.total_steps == 12
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| No loss-bearing tokens | 12 |" in card


# ---- 2. degenerate features --------------------------------------------------------------------------------------
def blobs(sizes=(20, 20, 20), dim=6, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim)) * 3
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return centers[truth] + 0.1 * rng.normal(size=(truth.size, dim)), truth


@pytest.mark.parametrize("method", ["hdbscan", "kmeans"])
def test_nonfinite_rows_form_their_own_group(method):
    features, truth = blobs()
    features[[3, 25]] = np.nan
    features[47, 2] = np.inf
    features[50, 0] = -np.inf
    config = hdbscan_config(cluster_method=method, data_fraction=0.5, **({"kmeans_n_clusters": 3} if method == "kmeans" else {}))
    result = cluster_features(features, config)
    bad = [3, 25, 47, 50]
    assert result.n_clusters == 4 and result.n_nonfinite == 4 and result.params["n_nonfinite_features"] == 4
    assert (result.labels[bad] == 3).all() and (result.raw_labels[bad] == NONFINITE_LABEL).all()
    good = np.setdiff1d(np.arange(60), bad)
    assert sorted(np.bincount(result.labels[good]).tolist()) == [18, 19, 19]
    assert adjusted_rand_score(truth[good], result.labels[good]) == 1.0
    assert np.isfinite(result.reduced).all() and (result.reduced[bad] == 0).all()
    assert "4 examples with non-finite (NaN/inf) features were kept out of clustering and form group 3" in (
        result.fallback)
    chosen = select_subset(result, config)
    assert chosen.n_kept == 30 and np.unique(chosen.indices).size == 30
    assert chosen.weights.sum() == pytest.approx(60) and np.isfinite(chosen.weights).all()
    assert (chosen.labels == 3).sum() == 2  # proportional: 30 · 4/60


def test_nonfinite_rows_join_the_smallest_cluster_when_merged():
    features, _ = blobs(sizes=(30, 12))
    features[[0, 1]] = np.nan
    config = ClusterSelectConfig.paper(strategy_kwargs={"kmeans_size_cap": None})
    result = cluster_features(features, config, world_size=2, loss_tokens=np.r_[np.ones(40), 0, 0].astype(int),
                              merge_unclusterable=True)
    assert result.n_clusters == 2 and result.n_nonfinite == 2 and result.n_no_loss == 2
    smallest = int(np.argmin(np.bincount(result.labels[2:40])))
    assert (result.labels[[0, 1, 40, 41]] == smallest).all()
    assert "joined the smallest cluster" in result.fallback


def test_every_row_nonfinite():
    result = cluster_features(np.full((5, 3), np.nan), hdbscan_config())
    assert result.n_clusters == 1 and result.labels.tolist() == [0] * 5 and result.n_nonfinite == 5
    assert result.fallback.startswith("no example has finite features and loss-bearing tokens; 5 examples")
    chosen = select_subset(result, hdbscan_config(data_fraction=0.4))
    assert chosen.indices.tolist() == [0, 1] and chosen.weights.tolist() == [2.5, 2.5]


def test_no_loss_examples_are_kept_out_and_selected_last():
    features, _ = blobs()
    tokens = np.full(60, 5)
    tokens[[0, 1, 2, 30]] = 0
    features[[0, 1, 2, 30]] = 0.0  # what feature extraction gives them
    result = cluster_features(features, hdbscan_config(), loss_tokens=tokens)
    assert result.n_no_loss == 4 and result.n_clusters == 4 and (result.labels[[0, 1, 2, 30]] == 3).all()
    chosen = select_subset(result, hdbscan_config(data_fraction=0.5))
    assert chosen.n_kept == 30 and not {0, 1, 2, 30} & set(chosen.indices.tolist())
    assert chosen.weights.sum() == pytest.approx(60)
    full = select_subset(result, hdbscan_config(data_fraction=0.95))  # 57 > 56 eligible: 1 filler, by index
    assert full.n_kept == 57 and set(range(60)) - set(full.indices.tolist()) == {1, 2, 30}
    assert np.allclose(full.weights, 60 / 57)


def test_constant_features():
    result = cluster_features(np.ones((20, 8)), hdbscan_config())
    assert result.n_clusters == 1 and result.fallback == "all 20 examples have identical features: one cluster"
    chosen = select_subset(result, hdbscan_config(data_fraction=0.25))
    assert chosen.n_kept == 5 and chosen.weights.tolist() == [4.0] * 5


def test_duplicate_rows_form_piles():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(3, 5))
    features = np.repeat(rows, 10, axis=0)
    result = cluster_features(features, hdbscan_config(hdbscan_min_cluster_size=5))
    assert result.n_clusters == 3 and result.params["n_piles"] == 3
    assert [len(set(result.labels[i * 10:(i + 1) * 10])) for i in range(3)] == [1, 1, 1]
    assert np.isfinite(result.reduced).all()


def test_single_example():
    result = cluster_features(np.array([[0.3, -1.0, 2.0]]), hdbscan_config())
    assert result.n_clusters == 1 and result.labels.tolist() == [0]
    chosen = select_subset(result, hdbscan_config(data_fraction=0.1))
    assert chosen.indices.tolist() == [0] and chosen.weights.tolist() == [1.0]


def test_fewer_examples_than_min_cluster_size():
    features, _ = blobs(sizes=(2, 2))
    result = cluster_features(features, hdbscan_config(hdbscan_min_cluster_size=10))
    assert result.n_clusters == 1
    assert result.fallback == "4 distinct rows outside duplicate piles, fewer than min_cluster_size=10: one cluster"


def test_degenerate_features_through_the_trainer(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    """NaN/inf rows (an fp16 overflow) and rows without loss-bearing tokens: the run continues, the report and the
    model card count them, non-finite rows are kept in their own group, no-loss rows are not selected."""
    original = FEATURES.get("last_layer_grad")
    nonfinite, no_loss = [5, 17, 40, 60], list(range(70, 80))

    def degenerate(model, dataset, indices, collate_fn, **kwargs):
        out = original(model, dataset, indices, collate_fn, **kwargs)
        features, tokens = out.features.clone(), out.loss_tokens.clone()
        features[nonfinite[:3]] = float("nan")
        features[nonfinite[3], 0] = float("inf")
        features[no_loss], tokens[no_loss] = 0.0, 0
        return FeatureOutput(features=features, loss_tokens=tokens, seconds=out.seconds)

    monkeypatch.setitem(FEATURES._entries, "last_layer_grad", degenerate)
    trainer = build(tmp_path, tiny_lm, lm_dataset, collator)
    trainer.train()
    report = json.loads((tmp_path / "out" / "selection_report.json").read_text())
    assert report["n_nonfinite_features"] == 4 and report["n_no_loss_tokens"] == 10
    assert [report["raw_labels"][i] for i in nonfinite] == [NONFINITE_LABEL] * 4
    groups = {report["labels"][i] for i in nonfinite}
    assert len(groups) == 1 and report["cluster_sizes"][groups.pop()] == 4
    kept = set(trainer.selection.indices.tolist())
    assert len(kept) == 48 and not kept & set(no_loss) and len(kept & set(nonfinite)) >= 1
    assert sum(report["weights"]) == pytest.approx(96)
    assert trainer.state.global_step == trainer.step_plan.total_steps == 14
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| Non-finite features | 4 |" in card and "| No loss-bearing tokens | 10 |" in card


@pytest.mark.parametrize("n, batch, config, kept, steps", [
    (1, 1, hdbscan_config(data_fraction=1.0, selection_warmup_steps=0), 1, 1),  # a single example
    (6, 2, hdbscan_config(data_fraction=0.5, selection_warmup_steps=0, hdbscan_min_cluster_size=10), 3, 2),
])
def test_tiny_datasets_train(tmp_path, tiny_lm, lm_dataset, collator, n, batch, config, kept, steps):
    trainer = build(tmp_path, tiny_lm, lm_dataset.select(range(n)), collator, config=config,
                    per_device_train_batch_size=batch)
    trainer.train()
    assert trainer.selection.n_kept == kept and trainer.selection_report.n_clusters == 1
    assert trainer.state.global_step == trainer.step_plan.total_steps == steps


# ---- 4. optional dependency failure (in-process; the import itself: test_persistence_interrupt.py) ---------------
def test_broken_hdbscan_fails_at_plan_with_the_fix(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    monkeypatch.setitem(sys.modules, "hdbscan", None)  # `import hdbscan` now raises ImportError
    message = fails_before_model_work(build(tmp_path, tiny_lm, lm_dataset, collator), error=ImportError)
    assert message.startswith("hf_cluster_select needs the `hdbscan` package for cluster_method='hdbscan' but could "
                              "not import it (ModuleNotFoundError: import of hdbscan halted; None in sys.modules).")
    for hint in ("`pip install hdbscan`", "`pip install --force-reinstall --no-cache-dir hdbscan`",
                 "ClusterSelectConfig(cluster_method='kmeans')"):
        assert hint in message
    kmeans = build(tmp_path, tiny_lm, lm_dataset, collator, config=hdbscan_config(cluster_method="kmeans"))
    assert kmeans.plan().total_steps == 2 + 8  # 29 of 96 kept; the fallback plans (and trains: see the subprocess test)


# ---- 3. atomic artefacts and checkpoint completeness (the kills themselves: test_persistence_interrupt.py) -------
def _selection(n_kept=2):
    return Selection(indices=np.arange(n_kept), weights=np.full(n_kept, 4 / n_kept), labels=np.zeros(n_kept, int),
                     n_total=4)


def _save(folder, n_kept=2):
    return save_selection(str(folder), _selection(n_kept), labels=np.zeros(4, int), raw_labels=np.zeros(4, int),
                          config={}, fingerprint="f")


class Killed(BaseException):
    pass


def _interrupt_rename(monkeypatch):
    def killed(*args, **kwargs):
        raise Killed()

    monkeypatch.setattr(os, "replace", killed)


def test_interrupted_writes_leave_the_previous_file_or_nothing(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    report = SelectionReport(n_examples=4, n_kept=2, n_clusters=1, cluster_sizes=[4], kept_per_cluster=[2])
    report.save(tmp_path / "selection_report.json")
    write_model_card(tmp_path, report)
    plot_cluster_sizes(report, tmp_path / "cluster_sizes.png")
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    _interrupt_rename(monkeypatch)
    with pytest.raises(Killed):
        _save(tmp_path, 3)
    with pytest.raises(Killed):
        SelectionReport(n_examples=4, n_kept=3).save(tmp_path / "selection_report.json")
    with pytest.raises(Killed):
        write_model_card(tmp_path, SelectionReport(n_examples=4, n_kept=3))
    with pytest.raises(Killed):
        plot_cluster_sizes(report, tmp_path / "cluster_sizes.png")
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before  # no temp file left
    assert load_selection(str(tmp_path)).selection.n_kept == 2


def test_stale_temporary_selection_is_removed(tmp_path):
    (tmp_path / ".cluster_selection.npz.abc123.tmp").write_bytes(b"half")
    _save(tmp_path)
    assert os.listdir(tmp_path) == [SELECTION_FILENAME]


def _checkpoint(root, step, *, state=True, selection=False, state_text=None, weights=True):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if weights:
        (folder / "model.safetensors").write_bytes(b"weights")
    if state:
        (folder / "trainer_state.json").write_text(state_text or json.dumps({"global_step": step}))
    if selection:
        _save(folder)
    return str(folder)


def test_checkpoint_problems(tmp_path):
    assert checkpoint_problems(_checkpoint(tmp_path, 2), warmup_steps=3) == []
    assert checkpoint_problems(_checkpoint(tmp_path, 4, selection=True), warmup_steps=3) == []
    assert checkpoint_problems(_checkpoint(tmp_path, 6), warmup_steps=3) == [
        "no cluster_selection.npz although it was saved after selection (step 6 > warmup_steps 3)"]
    assert checkpoint_problems(_checkpoint(tmp_path, 8, state=False), warmup_steps=3) == [
        "no trainer_state.json (Trainer writes it last)"]
    assert checkpoint_problems(_checkpoint(tmp_path, 10, state_text='{"global_st'), warmup_steps=3)[0].startswith(
        "unreadable trainer_state.json (JSONDecodeError")
    assert checkpoint_problems(_checkpoint(tmp_path, 14, weights=False), warmup_steps=3) == [
        "no model weights (*.safetensors, *.bin or a DeepSpeed/FSDP folder)"]
    corrupt = _checkpoint(tmp_path, 12)
    with open(os.path.join(corrupt, SELECTION_FILENAME), "wb") as handle:
        handle.write(b"PK\x03\x04 truncated")
    assert checkpoint_problems(corrupt, warmup_steps=3)[0].endswith(
        "is not a readable selection file: truncated or damaged .npz archive (File is not a zip file)")


def test_resume_picks_the_newest_complete_checkpoint(tmp_path, caplog):
    assert resolve_resume_checkpoint(None, str(tmp_path), 3) is None
    assert resolve_resume_checkpoint(False, str(tmp_path), 3) is None
    with pytest.raises(ValueError, match=r"^No valid checkpoint found in output directory"):
        resolve_resume_checkpoint(True, str(tmp_path), 3)
    two = _checkpoint(tmp_path, 2)
    four = _checkpoint(tmp_path, 4, selection=True)
    six = _checkpoint(tmp_path, 6)  # killed between trainer_state.json and our selection
    _checkpoint(tmp_path, 8, state=False)  # killed while writing the weights
    with caplog.at_level(logging.WARNING, logger="hf_cluster_select.persistence"):
        assert resolve_resume_checkpoint(True, str(tmp_path), 3) == four
    assert "skipped incomplete checkpoints" in caplog.text and "checkpoint-8: no trainer_state.json" in caplog.text
    assert resolve_resume_checkpoint(two, str(tmp_path), 3) == two
    with pytest.raises(ValueError) as info:
        resolve_resume_checkpoint(six, str(tmp_path), 3)
    assert str(info.value) == (
        f"`resume_from_checkpoint` {six!r} is incomplete (no cluster_selection.npz although it was saved after "
        "selection (step 6 > warmup_steps 3)); the run was probably interrupted while saving it. Resume from a "
        "complete checkpoint instead (complete: ['checkpoint-2', 'checkpoint-4']), or pass "
        "resume_from_checkpoint=True to pick the latest complete one."
    )
    os.remove(os.path.join(four, SELECTION_FILENAME))
    os.remove(os.path.join(two, "trainer_state.json"))
    with pytest.raises(ValueError, match="no complete checkpoint in `output_dir`"):
        resolve_resume_checkpoint(True, str(tmp_path), 3)


def test_select_from_labels_rejects_misshapen_deferred():
    with pytest.raises(ValueError, match=r"`deferred` must have shape \[3\], got \(2,\)"):
        select_from_labels([0, 0, 1], within_cluster="random", data_fraction=0.5, deferred=[True, False])


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), 0.5, True, "1.5"])
def test_kmeans_size_cap_must_be_a_finite_number_of_at_least_one(cap):
    """`inf` used to pass and fail only inside the clustering (`math.ceil(inf)`), after the warm-up."""
    with pytest.raises(ValueError, match=r"`strategy_kwargs`: `kmeans_size_cap` must be a finite number >= 1.0 or "
                                         r"None, got "):
        ClusterSelectConfig(cluster_method="kmeans", strategy_kwargs={"kmeans_size_cap": cap})
    assert ClusterSelectConfig(cluster_method="kmeans",
                               strategy_kwargs={"kmeans_size_cap": 1}).cluster_settings.kmeans_size_cap == 1
