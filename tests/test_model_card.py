"""Tests of `hf_cluster_select.model_card`: the selection section, and writing it into new and existing cards."""

from __future__ import annotations

import os

import pytest

from hf_cluster_select.config import ClusterSelectConfig
from hf_cluster_select.reporting.model_card import (
    END_MARKER,
    HEADING,
    START_MARKER,
    looks_like_hub_id,
    selection_card_section,
    write_model_card,
)
from hf_cluster_select.reporting.report import SelectionReport

TRL_CARD = """---
base_model: null
library_name: transformers
model_name: out
tags:
- generated_from_trainer
- trl
- sft
licence: license
---

# Model Card for out

This model is a fine-tuned version of [None](https://huggingface.co/None).

## Training procedure

This model was trained with SFT.
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def make_report(**overrides) -> SelectionReport:
    """7,688 examples, 2,306 kept, 3 clusters; warm-up 50 steps in 120 s; 144 of 480 full-data steps."""
    values = dict(
        n_examples=7688, n_kept=2306, tokens_total=1_234_567, tokens_kept=400_000, token_kind="loss",
        n_clusters=3, n_noise=412, cluster_sizes=[4000, 2688, 1000], kept_per_cluster=[1200, 806, 300],
        clustering_method="hdbscan", fallback=None, clustering_params={"min_cluster_size": 35, "min_samples": 1},
        config=ClusterSelectConfig().to_dict(), world_size=2, per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        warmup_seconds=120.0, features_seconds=45.25, clustering_seconds=12.5, selection_seconds=60.0,
        training_seconds=345.6, warmup_steps=50, selected_steps=144, full_data_steps=480,
    )
    values.update(overrides)
    report = SelectionReport(**values)
    if report.training_seconds is not None:
        report.apply_savings()
    return report


def test_section_numbers_and_labels():
    section = selection_card_section(make_report(), plot_filename="cluster_sizes.png")
    assert section.startswith(START_MARKER + "\n" + HEADING) and section.endswith(END_MARKER)
    assert "| Examples kept | 2,306 / 7,688 (30.0%) |" in section
    assert "| Tokens kept | 400,000 / 1,234,567 (32.4%) | loss-bearing tokens" in section
    assert "| Clusters | 3 |" in section and "| Noise points | 412 |" in section
    assert "| Clustering method | hdbscan | no fallback" in section
    assert "2 rank(s) × 8 examples per device × 2 accumulation step(s) = 32 examples per optimizer step" in section
    assert "| Warm-up training | 120.0 s (2 min 00 s), 50 optimizer steps |" in section
    assert "| Feature extraction | 45.2 s | wall-clock time computing per-example features |" in section
    cached = selection_card_section(make_report(features_seconds=0.5, features_from_cache=True))
    assert "| Feature extraction | 0.5 s | wall-clock time loading per-example features from the feature cache" in cached
    assert "| Clustering | 12.5 s |" in section
    assert "| Selection, total | 60.0 s (1 min 00 s) |" in section
    assert "| Training on the selection | 345.6 s (5 min 46 s), 144 optimizer steps |" in section
    # full data: (120 + 345.6) s / (50 + 144) steps = 2.4 s/step × 480 = 1152 s; ours 120 + 60 + 345.6 = 525.6 s.
    assert "| Total with selection | 525.6 s (8 min 46 s) |" in section
    assert (
        "| Full-data training time | 1,152.0 s (19 min 12 s), 480 optimizer steps | estimated from this run's "
        "measured throughput (2.4 s/step over 194 optimizer steps × 480 full-data steps) |"
    ) in section
    assert "| Time saved | 626.4 s (10 min 26 s); 54.4% of the full-data time |" in section
    assert "| 0 | 4,000 | 1,200 | 30.0% |" in section and "| 2 | 1,000 | 300 | 30.0% |" in section
    assert "![Examples per cluster, full data and kept](cluster_sizes.png)" in section
    assert '"data_fraction": 0.3' in section and '"min_cluster_size": 35' in section
    assert "Kim, Nam, Han, Choi, Lee; EMNLP 2026" in section and "2609.12584" in section


def test_section_not_measured_and_measured_basis():
    report = make_report(training_seconds=None, features_seconds=None, tokens_total=None, tokens_kept=None,
                         fallback="all noise → one cluster")
    section = selection_card_section(report)
    assert "| Tokens kept | not measured |" in section
    assert "| Feature extraction | not measured |" in section
    assert "| Training on the selection | not measured, 144 optimizer steps |" in section
    assert "| Time saved | not measured |" in section
    assert "fallback: all noise → one cluster" in section
    assert "![" not in section

    measured = make_report()
    measured.apply_savings(measured_full_seconds=1000.0)
    section = selection_card_section(measured.to_dict())  # the JSON dict works too
    assert "| Full-data training time | 1,000.0 s (16 min 40 s), 480 optimizer steps | measured |" in section
    assert "| Time saved | 474.4 s (7 min 54 s); 47.4% of the full-data time |" in section


def test_new_card_offline_with_hub_base_model(tmp_path):
    out = tmp_path / "run"
    path = write_model_card(out, make_report(), base_model="HuggingFaceTB/SmolLM2-135M",
                            dataset_name="my_org/instructions", plot_filename=str(out / "cluster_sizes.png"))
    text = open(path, encoding="utf-8").read()
    front, body = text.split("---\n")[1], text.split("---\n", 2)[2]
    assert "base_model: HuggingFaceTB/SmolLM2-135M" in front
    assert "library_name: transformers" in front
    assert "- hf_cluster_select" in front and "- data-selection" in front
    assert "- my_org/instructions" in front
    assert "# run" in body
    assert "(cluster_sizes.png)" in body
    assert body.count(START_MARKER) == 1 and body.count(END_MARKER) == 1
    assert os.listdir(out) == ["README.md"]  # no temp file left behind


def test_local_base_model_path_is_not_a_hub_id(tmp_path, monkeypatch):
    local_model = tmp_path / "my_model"
    local_model.mkdir()
    path = write_model_card(tmp_path / "out", make_report(), base_model=str(local_model))
    text = open(path, encoding="utf-8").read()
    assert "base_model" not in text
    assert str(local_model) not in text
    assert "from a local model" in text
    for name in ("./ckpt", "../a/b", "~/model", "/abs/owner/name", "checkpoints/run-1/extra", "owner/name with space"):
        assert not looks_like_hub_id(name)
    assert looks_like_hub_id("meta-llama/Llama-2-7b-hf")
    monkeypatch.chdir(tmp_path)  # an existing relative folder shaped like owner/name is a path, not a Hub id
    (tmp_path / "owner" / "name").mkdir(parents=True)
    assert not looks_like_hub_id("owner/name")


def test_existing_card_preserved_and_section_replaced_not_duplicated(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(TRL_CARD, encoding="utf-8")
    write_model_card(tmp_path, make_report())
    first = readme.read_text(encoding="utf-8")
    trl_header, trl_body = TRL_CARD.split("\n---\n", 1)
    ours = ('data_selection: "hf_cluster_select"\ndata_fraction: 0.3\nfraction_kept: 0.2999\nn_examples: 7688\n'
            'n_kept: 2306\nn_clusters: 3\nclustering_method: "hdbscan"\nselection_seconds: 60.0\n'
            'fraction_saved: 0.5437\nfraction_saved_basis: "estimated"')
    # TRL's front matter and body kept verbatim, our metadata added at the end of the front matter
    assert first.startswith(trl_header + "\n" + ours + "\n---\n" + trl_body.rstrip("\n"))
    assert first.count(START_MARKER) == 1 and "2,306 / 7,688 (30.0%)" in first

    write_model_card(tmp_path, make_report(n_kept=1000, kept_per_cluster=[500, 300, 200]))
    second = readme.read_text(encoding="utf-8")
    assert second.count(START_MARKER) == 1 and second.count(END_MARKER) == 1 and second.count(HEADING) == 1
    assert "1,000 / 7,688 (13.0%)" in second and "2,306 / 7,688" not in second
    assert second.startswith(trl_header + "\n") and second.count("data_selection:") == 1
    assert "n_kept: 1000\n" in second and trl_body.rstrip("\n") in second

    # Content someone appended after our section survives a rewrite.
    readme.write_text(second + "\n## Evaluation\n\nAdded later.\n", encoding="utf-8")
    write_model_card(tmp_path, make_report())
    third = readme.read_text(encoding="utf-8")
    assert third.count(START_MARKER) == 1 and "## Evaluation\n\nAdded later." in third
    assert third.index(END_MARKER) < third.index("\n## Evaluation\n\nAdded later.")


def test_no_local_base_model_in_any_saved_card(tmp_path, tokenizer, _tiny_lm_base, lm_dataset, collator):
    """A LoRA model loaded from a local folder: PEFT writes `base_model: <folder>` into the README of every save;
    after `save_model()` and in every checkpoint the card holds no local path (the Hub rejects it)."""
    from huggingface_hub import ModelCard
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM, TrainingArguments

    from hf_cluster_select import ClusterSelectConfig, ClusterTrainer
    from hf_cluster_select.reporting.model_card import without_local_base_model

    local = tmp_path / "local_base"
    _tiny_lm_base.save_pretrained(local)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(local),
                           LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_train_epochs=1,
                             save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, disable_tqdm=True,
                             warmup_steps=0)
    trainer = ClusterTrainer(model=model, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0))
    trainer.train()
    trainer.save_model()
    cards = [tmp_path / "out" / "README.md", *sorted((tmp_path / "out").glob("checkpoint-*/README.md"))]
    assert len(cards) >= 2
    for path in cards:
        text = path.read_text()
        data = ModelCard(text).data
        assert str(local) not in text, path
        assert data.base_model is None and not any(str(t).startswith("base_model:") for t in data.tags or [])
    hub = "---\nbase_model: HuggingFaceTB/SmolLM2-135M\ntags:\n- base_model:adapter:HuggingFaceTB/SmolLM2-135M\n---\nx\n"
    assert without_local_base_model(hub) == hub  # Hub ids stay


@pytest.mark.parametrize("count, params, phrase", [
    (1538, {"noise_share": 0.2}, "noise_share=0.2"),
    (3020, {"noise_share": 0.2, "noise_rate_estimate": 0.3791, "noise_share_applied": 0.3791},
     'noise_share=0.3791 ("auto": the estimated noise rate 0.3791 is used from 0.3, at most 0.5; 0.2 below 0.3)'),
    (0, {"noise_share": 0.2, "reply_disagreement": 0.0427, "noise_share_applied": 0.0},
     'noise_share=0 ("auto": 0.0427 of the replies disagree with their prompt neighbours\', under 0.1: the filter is '
     'off; 0.2 from 0.1)'),
    (16, {"noise_share": 0.2, "reply_disagreement": 0.1125, "noise_share_applied": 0.2},
     'noise_share=0.2 ("auto": 0.1125 of the replies disagree with their prompt neighbours\', at least 0.1: the '
     'filter is on; 0.2 from 0.1)')])
def test_suspected_noise_row_and_report_line_give_the_count_and_share(count, params, phrase):
    """The noise filter's count and the share it deferred, as given, as a classification head's estimate set it, or
    as a language model's reading turned it off or on, in the card and in `hf-cluster-select report`'s lines."""
    from hf_cluster_select.commands_report import _noise_lines

    report = make_report(n_suspected_noise=count, clustering_params=params)
    assert f"| Suspected noise | {count:,} | deferred: the {phrase} of each cluster" in selection_card_section(report)
    assert _noise_lines(report.to_dict()) == [
        f"suspected noise: {count} examples deferred ({phrase} of each cluster, lowest k-NN agreement)"]


def test_no_suspected_noise_row_or_line_when_the_filter_did_not_run():
    """No "Suspected noise" row or report line without `n_suspected_noise` (the filter did not run)."""
    from hf_cluster_select.commands_report import _noise_lines

    off = make_report()
    assert "Suspected noise" not in selection_card_section(off) and _noise_lines(off.to_dict()) == []


@pytest.mark.parametrize("setting, estimate, warmup_steps, row", [
    ("auto", 0.38, 7, "reset_optimizer_state='auto'"), ("auto", 0.25, 7, None),
    (True, None, 3, "reset_optimizer_state=True"), (False, 0.9, 7, None), (True, None, 0, None)])
def test_the_card_says_when_the_optimizer_state_was_cleared(setting, estimate, warmup_steps, row):
    """An "Optimizer state" row when the run cleared Adam's state after its warm-up: `reset_optimizer_state=True`,
    or `"auto"` (the default) with a noise estimate >= 0.3; none otherwise, nor without a warm-up (a given
    selection)."""
    config = ClusterSelectConfig(strategy_kwargs={} if setting == "auto" else {"reset_optimizer_state": setting})
    params = {} if estimate is None else {"noise_rate_estimate": estimate}
    report = make_report(clustering_params=params, warmup_steps=warmup_steps, config=config.to_dict())
    section = selection_card_section(report)
    if row is None:
        assert "| Optimizer state |" not in section
    else:
        assert f"| Optimizer state | cleared after the warm-up | {row}: Adam's moments restarted" in section
