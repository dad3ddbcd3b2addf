"""What a finished run publishes: logged figures equal to the card's (TensorBoard read back), the card's YAML
metadata, its evaluation table and the 2-D feature map."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.reporting.feature_map import feature_map_points


def _trainer(tmp_path, model, dataset, collator, **args):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1, report_to=[],
                  save_strategy="no", use_cpu=True, disable_tqdm=True, warmup_steps=0, logging_steps=2)
    values.update(args)
    return ClusterTrainer(model=model, args=TrainingArguments(**values), train_dataset=dataset,
                          eval_dataset=dataset.select(range(16)), data_collator=collator,
                          cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0))


def _scalars(log_dir: str) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[str, list[float]] = {}
    for events in sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)):
        accumulator = EventAccumulator(events)
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:  # transformers 5 prefixes training logs with "train/"
            values.setdefault(tag.removeprefix("train/"), []).extend(e.value for e in accumulator.Scalars(tag))
    return values


def test_tensorboard_gets_the_card_figures_then_the_measured_ones(tmp_path, tiny_lm, lm_dataset, collator,
                                                                  monkeypatch):
    pytest.importorskip("tensorboard")
    log_dir = str(tmp_path / "tb")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", log_dir)  # transformers 5: where TensorBoardCallback writes
    trainer = _trainer(tmp_path, tiny_lm, lm_dataset, collator, report_to=["tensorboard"])
    trainer.train()
    report = trainer.selection_report
    files = glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)
    assert len(files) == 1  # the end-of-training figures reach the open writer, not a second file
    scalars = _scalars(log_dir)
    assert scalars["cluster_select/n_kept"] == [48.0] and scalars["cluster_select/fraction_kept"] == [0.5]
    assert scalars["cluster_select/seconds_saved_estimated"] == [pytest.approx(report.seconds_saved, rel=1e-6)]
    assert scalars["cluster_select/total_seconds"] == [pytest.approx(report.total_seconds, rel=1e-6)]
    # a measured full-data time given afterwards is logged once more, labelled measured, to the same run folder
    trainer.finalize_selection_report(measured_full_seconds=report.total_seconds * 2)
    scalars = _scalars(log_dir)
    assert scalars["cluster_select/full_data_seconds_measured"] == [pytest.approx(report.total_seconds * 2, rel=1e-6)]
    assert scalars["cluster_select/fraction_saved_measured"] == [pytest.approx(0.5, rel=1e-6)]
    assert scalars["cluster_select/seconds_saved_estimated"] == [pytest.approx(
        trainer.state.log_history[-2]["cluster_select/seconds_saved_estimated"], rel=1e-6)]


def test_card_metadata_evaluation_and_feature_map(tmp_path, tiny_lm, lm_dataset, collator):
    from huggingface_hub import ModelCard

    trainer = _trainer(tmp_path, tiny_lm, lm_dataset, collator, eval_strategy="epoch")
    trainer.train()
    out = tmp_path / "out"
    card = ModelCard.load(out / "README.md")
    report = trainer.selection_report
    assert card.data.data_selection == "hf_cluster_select" and card.data.data_fraction == 0.5
    assert card.data.n_kept == 48 and card.data.n_examples == 96 and card.data.n_clusters == report.n_clusters
    assert card.data.fraction_saved_basis == "estimated"
    eval_loss = trainer.state.log_history[-3]["eval_loss"]
    assert f"| eval_loss | {eval_loss:.4g} |" in card.text
    assert f"at optimizer step {trainer.state.global_step}" in card.text
    assert "![Features in 2-D (PCA), coloured by cluster, kept examples outlined](feature_map.png)" in card.text
    assert (out / "feature_map.png").stat().st_size > 5000
    points = report.feature_map
    assert len(points["indices"]) == 96 and len(points["x"]) == 96 and sum(points["explained_variance_ratio"]) <= 1
    # evaluate() after training, then the card again: the newer figures are the ones shown
    trainer.evaluate(eval_dataset=lm_dataset.select(range(8)))
    trainer.write_selection_card(str(out))
    newest = trainer.state.log_history[-1]["eval_loss"]
    assert f"| eval_loss | {newest:.4g} |" in ModelCard.load(out / "README.md").text


def test_feature_map_points_sample_and_skip_unusable_rows():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(50, 6))
    features[3] = np.nan
    features[7] = 0.0
    points = feature_map_points(features, seed=1, max_points=20)
    assert len(points["indices"]) == 20 and 3 not in points["indices"] and 7 not in points["indices"]
    assert points["indices"] == sorted(points["indices"]) and len(set(points["indices"])) == 20
    assert points == feature_map_points(features, seed=1, max_points=20)  # seeded
    assert feature_map_points(features[:2], seed=0) is None
