"""TokenBalanceMeter (measured token balance across ranks) and its logging by ClusterTrainer on one process."""

from __future__ import annotations

import pytest
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
from hf_cluster_select.batching.meter import TokenBalanceMeter

METRICS = ("cluster_select/max_tokens_per_rank", "cluster_select/mean_tokens_per_rank",
           "cluster_select/max_over_mean_tokens")


def test_meter_without_process_group():
    meter = TokenBalanceMeter()
    assert meter.pop_metrics() == {}
    meter.add(40)
    meter.add(24)
    assert meter.end_step() == (64.0, 64.0)
    meter.add(10)
    meter.end_step()
    meter.add(7)  # a micro-batch of the next, unfinished step stays counted
    assert meter.steps == 2
    assert meter.pop_metrics() == {METRICS[0]: 37.0, METRICS[1]: 37.0, METRICS[2]: 1.0}
    assert meter.steps == 0 and meter.pop_metrics() == {}
    assert meter.end_step() == (7.0, 7.0)


def test_meter_rejects_negative_tokens():
    with pytest.raises(ValueError, match="tokens"):
        TokenBalanceMeter().add(-1)


def test_trainer_logs_token_balance_every_logging_step(tmp_path, tiny_lm, lm_dataset, collator):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                             logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                             warmup_steps=2)
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=0.5))
    seen = []
    original = trainer.cluster_callback.record_tokens
    trainer.cluster_callback.record_tokens = lambda tokens: (seen.append(tokens), original(tokens))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == trainer.state.global_step == 14  # 2 warm-up steps + 12 over 48 kept examples
    assert [entry[METRICS[0]] for entry in logs] == [float(t) for t in seen]  # one micro-batch per step
    for entry in logs:  # one rank: the busiest rank is the average rank
        assert entry[METRICS[0]] == entry[METRICS[1]] > 0 and entry[METRICS[2]] == 1.0
