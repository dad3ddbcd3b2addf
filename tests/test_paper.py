"""CluSTER's allocation: per-rank loss weights K·|C_k|/N and the checks that reject settings it cannot run with."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.batching.paper import check_paper_allocation, cluster_rank_weights


def test_cluster_rank_weights_exact():
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 2])  # |C| = 3, 6, 1; N = 10
    weights = cluster_rank_weights([1, 0, 2, 1], labels, 3)
    np.testing.assert_allclose(weights, [3 * 6 / 10, 3 * 3 / 10, 3 * 1 / 10, 3 * 6 / 10])
    # one example of each cluster: the weights average to 1 over ranks (the full-data mixture)
    assert cluster_rank_weights([0, 1, 2], labels, 3).mean() == pytest.approx(1.0)


def test_cluster_rank_weights_errors():
    with pytest.raises(ValueError, match="does not occur"):
        cluster_rank_weights([5], [0, 1], 2)
    with pytest.raises(ValueError, match="n_ranks"):
        cluster_rank_weights([0], [0, 1], 0)


@pytest.mark.parametrize(
    "world_size, method, k, message",
    [(1, "kmeans", None, "at least 2 processes"), (2, "hdbscan", None, "cluster_method"), (4, "kmeans", 3, "kmeans_n")],
)
def test_check_paper_allocation(world_size, method, k, message):
    with pytest.raises(ValueError, match=message):
        check_paper_allocation(world_size, method, k)
    check_paper_allocation(2, "kmeans", None)
    check_paper_allocation(2, "kmeans", 2)


def test_paper_needs_selection_before_training():
    with pytest.raises(ValueError, match="warmup_steps"):
        ClusterSelectConfig(allocation="paper", selection_warmup_steps=3)
    assert ClusterSelectConfig.paper().selection_warmup_steps == 0


def test_paper_on_one_process_fails_before_model_work(tmp_path, tiny_lm, lm_dataset, collator):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, report_to=[], use_cpu=True)
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig.paper())
    with pytest.raises(ValueError, match="at least 2 processes"):
        trainer.train()
    assert trainer.selection is None
