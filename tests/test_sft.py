"""ClusterSFTTrainer on a tiny Llama: the three TRL dataset formats × {full fine-tune, LoRA}, loss masks, features
over loss-bearing tokens, weighted loss on TRL's fused path, model card, and the errors raised before model work."""

from __future__ import annotations

import copy
import os
import random

import pytest
from tiny_assets import hdbscan_config
import torch
from datasets import Dataset, DatasetDict, disable_progress_bars
from trl import SFTConfig, SFTTrainer

from hf_cluster_select.features import FEATURES
from hf_cluster_select import ClusterSelectConfig, ClusterSFTTrainer, SelectionReport
from hf_cluster_select.data import INDEX_KEY
from hf_cluster_select.features.last_layer_grad import last_layer_grad_features
from hf_cluster_select.reporting.model_card import START_MARKER
from hf_cluster_select.weighting import weighted_token_loss

disable_progress_bars()

PROMPT_WORDS = "add subtract multiply divide number total sum answer question what is the of and price".split()
ANSWER_WORDS = "cost apple train speed hour minute distance percent ratio area circle square triangle side".split()
SPECIAL = ["[PAD]", "[UNK]", "[EOS]", "[BOS]", "[USER]", "[ASSISTANT]"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}[USER] {{ m['content'] }} "
    "{% else %}[ASSISTANT] {% generation %}{{ m['content'] }} [EOS]{% endgeneration %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)
N = 32
FORMATS = ("text", "prompt_completion", "messages")


@pytest.fixture(scope="module")
def chat_tokenizer():
    """WordLevel tokenizer trained locally with chat-role tokens and a chat template with generation markers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(PROMPT_WORDS + ANSWER_WORDS)] * 3,
                            trainers.WordLevelTrainer(special_tokens=SPECIAL))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]", bos_token="[BOS]",
        additional_special_tokens=["[USER]", "[ASSISTANT]"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def _chat_lm_base(chat_tokenizer):
    import tiny_assets
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_assets.llama_config(
        len(chat_tokenizer), max_position_embeddings=128, pad_token_id=chat_tokenizer.pad_token_id,
        eos_token_id=chat_tokenizer.eos_token_id, bos_token_id=chat_tokenizer.bos_token_id,
    ))


@pytest.fixture
def chat_lm(_chat_lm_base):
    return copy.deepcopy(_chat_lm_base)


def pairs(n: int = N, seed: int = 0, prompt_len=(3, 8)) -> list[tuple[str, str]]:
    """`n` (prompt, completion) pairs of words; two styles of completion (two 'skills')."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = " ".join(rng.choices(PROMPT_WORDS, k=rng.randint(*prompt_len)))
        words = ANSWER_WORDS[:7] if i % 2 else ANSWER_WORDS[7:]
        out.append((prompt, " ".join(rng.choices(words, k=rng.randint(2, 5)))))
    return out


def make_dataset(fmt: str, rows: list[tuple[str, str]]) -> Dataset:
    ids = list(range(len(rows)))
    if fmt == "text":
        return Dataset.from_dict({"text": [f"{p} {c}" for p, c in rows], "source_id": ids})
    if fmt == "prompt_completion":
        return Dataset.from_dict({"prompt": [p for p, _ in rows], "completion": [f" {c}" for _, c in rows],
                                  "source_id": ids})
    return Dataset.from_dict({
        "messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": c}] for p, c in rows],
        "source_id": ids,
    })


def expected_tokens(fmt: str, prompt: str, completion: str, vocab: dict) -> tuple[list[int], list[int]]:
    """`input_ids` and `labels` TRL must produce, from the word-level vocabulary (independent of TRL's code)."""
    p, c, eos = [vocab[w] for w in prompt.split()], [vocab[w] for w in completion.split()], vocab["[EOS]"]
    if fmt == "text":  # every token carries loss
        ids = p + c + [eos]
        return ids, list(ids)
    if fmt == "prompt_completion":  # completion-only loss (TRL's default for this format)
        return p + c + [eos], [-100] * len(p) + c + [eos]
    head = [vocab["[USER]"]] + p + [vocab["[ASSISTANT]"]]  # assistant-only loss
    return head + c + [eos], [-100] * len(head) + c + [eos]


def sft_args(tmp_path, **overrides) -> SFTConfig:
    values = dict(
        output_dir=str(tmp_path / "out"), bf16=False, use_cpu=True, activation_checkpointing=False, report_to=[],
        per_device_train_batch_size=4, per_device_eval_batch_size=8, num_train_epochs=1, learning_rate=1e-2,
        warmup_steps=1, lr_scheduler_type="linear", logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
        max_length=64,
    )
    values.update(overrides)
    return SFTConfig(**values)


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


class RecordingSFTTrainer(ClusterSFTTrainer):
    """Records, for every training micro-batch that reaches `compute_loss`: step, indices, input_ids, labels."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append((self.state.global_step, inputs[INDEX_KEY].tolist(), inputs["input_ids"].clone(),
                              inputs["labels"].clone(), inputs["attention_mask"].clone()))
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


def build(tmp_path, model, tokenizer, fmt, *, peft=False, config=None, cls=RecordingSFTTrainer, rows=None, **overrides):
    extra = {"assistant_only_loss": True} if fmt == "messages" else {}
    extra.update(overrides)
    trainer = cls(
        model=model, args=sft_args(tmp_path, **extra), train_dataset=make_dataset(fmt, rows or pairs()),
        processing_class=tokenizer, peft_config=lora_config() if peft else None,
        cluster_config=config or hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4),
    )
    trainer.seen = []
    return trainer


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_select_and_mask_exactly(tmp_path, chat_lm, chat_tokenizer, fmt, peft):
    from peft import PeftModel

    rows = pairs()
    trainer = build(tmp_path, chat_lm, chat_tokenizer, fmt, peft=peft, rows=rows)
    assert trainer.sft_format == ("conversational" if fmt == "messages" else fmt)
    assert isinstance(trainer.model, PeftModel) == peft
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()

    # 32 examples, keep 16; batch 4, 1 rank: 1 warm-up step (full data) + 4 steps on the kept examples
    plan = trainer.step_plan
    assert (plan.n_examples, plan.n_kept, plan.warmup_steps, plan.total_steps) == (32, 16, 1, 5)
    assert trainer.state.global_step == 5
    kept = trainer.selection.indices.tolist()
    warm = [i for step, batch, *_ in trainer.seen if step < 1 for i in batch]
    after = [i for step, batch, *_ in trainer.seen if step >= 1 for i in batch]
    assert len(warm) == 4 and len(set(warm)) == 4
    assert sorted(after) == sorted(kept) and len(kept) == 16  # every kept example exactly once, nothing else

    # loss masks: every row that reached the loss holds exactly the tokens and labels TRL must build for its example
    vocab = chat_tokenizer.get_vocab()
    for _, batch, input_ids, labels, attention in trainer.seen:
        for row, index in enumerate(batch):
            length = int(attention[row].sum())
            source = trainer.train_dataset[index]["source_id"]
            ids, mask = expected_tokens(fmt, *rows[source], vocab)
            assert input_ids[row, :length].tolist() == ids
            assert labels[row, :length].tolist() == mask
            assert (labels[row, length:] == -100).all()

    # what trained: LoRA trains adapters only, full fine-tuning the base weights
    changed = {k for k, v in trainer.model.named_parameters() if not torch.equal(v, before[k])}
    if peft:
        assert changed and all("lora_" in k for k in changed)
    else:
        assert any("q_proj" in k for k in changed)
    report = SelectionReport.load(tmp_path / "out" / "selection_report.json")
    assert report.n_dropped_by_preparation == 0 and report.n_examples == 32 and report.kept_indices == kept
    # the near-duplicate check runs by default where TRL's rows say which tokens carry the loss (completion_mask,
    # assistant_masks); plain text rows (loss on every token) get none
    assert report.clustering_params["near_duplicate_threshold"] == (None if fmt == "text" else 0.7)

    if peft:  # adapters saved as usual; TRL's card and our section both survive save_model + create_model_card
        trainer.save_model()
        trainer.create_model_card()
        out = tmp_path / "out"
        assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
        card = (out / "README.md").read_text()
        assert "It has been trained using [TRL]" in card and "### Framework versions" in card
        assert card.count(START_MARKER) == 1 and "Examples kept | 16 / 32 (50.0%)" in card
        assert "hf_cluster_select" in card and "Dropped before selection | 0" in card


def test_full_finetune_card_after_save(tmp_path, chat_lm, chat_tokenizer):
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion")
    trainer.train()
    trainer.save_model()
    trainer.create_model_card(model_name="tiny")
    out = tmp_path / "out"
    assert (out / "model.safetensors").is_file()
    card = (out / "README.md").read_text()
    assert "# Model Card for tiny" in card and "It has been trained using [TRL]" in card
    assert card.count(START_MARKER) == 1 and "cluster_sizes.png" in card
    assert "- hf_cluster_select" in card  # our tag, added to TRL's


def spy_features(monkeypatch):
    calls = []

    def spy(model, *args, **kwargs):
        output = last_layer_grad_features(model, *args, **kwargs)
        calls.append((model, args, kwargs, output))
        return output

    monkeypatch.setitem(FEATURES._entries, "last_layer_grad", spy)
    return calls


@pytest.mark.parametrize("fmt", ["prompt_completion", "messages"])
def test_loss_tokens_context_ignores_prompts(tmp_path, chat_lm, chat_tokenizer, monkeypatch, fmt):
    """Examples 2k and 2k+1 share their completion, not their prompt. With feature_context='loss_tokens' their
    features are identical; with the default 'full' context the prompt changes the hidden states, so they are not."""
    base = pairs(16)
    rows = [(prompt, base[k][1]) for k in range(16) for prompt in (base[k][0], base[(k + 5) % 16][0] + " what")]
    features = {}
    for context in ("loss_tokens", "full"):
        calls = spy_features(monkeypatch)
        config = hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4, feature_context=context,
                                     selection_warmup_steps=0)
        trainer = build(tmp_path / context, copy.deepcopy(chat_lm), chat_tokenizer, fmt, rows=rows, config=config)
        trainer.plan()
        trainer.run_selection()
        assert [trainer.train_dataset[i]["source_id"] for i in range(32)] == list(range(32))
        features[context] = calls[0][3].features
        assert calls[0][3].loss_tokens.tolist() == [len(c.split()) + 1 for _, c in rows]  # completion + EOS
    same, full = features["loss_tokens"], features["full"]
    for k in range(16):
        assert torch.allclose(same[2 * k], same[2 * k + 1], atol=1e-5), k
        assert not torch.allclose(full[2 * k], full[2 * k + 1], atol=1e-3), k


def test_full_context_feature_pools_loss_tokens_only(tmp_path, chat_lm, chat_tokenizer, monkeypatch):
    """Default features: mean over completion positions of (p_y - 1)·h on the whole sequence, L2-normalised."""
    calls = spy_features(monkeypatch)
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion",
                    config=hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4, selection_warmup_steps=0))
    trainer.plan()
    trainer.run_selection()
    features = calls[0][3].features
    vocab = chat_tokenizer.get_vocab()
    model = trainer.model.eval()
    captured = {}
    handle = model.lm_head.register_forward_hook(lambda m, a, o: captured.update(h=a[0][0]))
    try:
        for index in (0, 1, 7):
            prompt, completion = pairs()[index]
            ids, labels = expected_tokens("prompt_completion", prompt, completion, vocab)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            targets = torch.tensor(labels[1:])
            positions = (targets != -100).nonzero()[:, 0]
            p = torch.softmax(logits[positions], -1).gather(1, targets[positions, None])[:, 0]
            reference = ((p - 1)[:, None] * captured["h"][positions]).mean(0)
            assert positions.tolist() == list(range(len(prompt.split()) - 1, len(ids) - 1))
            assert torch.allclose(features[index], reference / reference.norm(), atol=1e-5)
    finally:
        handle.remove()


def test_lora_features_come_from_adapted_model(tmp_path, chat_lm, chat_tokenizer, monkeypatch):
    from peft import PeftModel

    seen = []

    def spy(model, *args, **kwargs):
        output = last_layer_grad_features(model, *args, **kwargs)
        with model.disable_adapter():  # the same data through the base model, at the same moment
            base = last_layer_grad_features(model, *args, **kwargs)
        seen.append((model, output, base))
        return output

    monkeypatch.setitem(FEATURES._entries, "last_layer_grad", spy)
    config = hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4, selection_warmup_steps=1)
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion", peft=True, config=config, warmup_steps=0)
    trainer.train()
    (model, output, base), = seen
    assert isinstance(model, PeftModel) and model is trainer.accelerator.unwrap_model(trainer.model)
    # the adapters trained during the warm-up step change the features: they were computed on the adapted model
    assert not torch.allclose(base.features, output.features, atol=1e-4)


def test_weighted_loss_on_trl_fused_path(tmp_path, chat_lm, chat_tokenizer, monkeypatch):
    calls = []
    original = SFTTrainer.compute_loss

    def spy(self, model, *args, **kwargs):
        calls.append(type(model).__name__)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "compute_loss", spy)
    config = hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4, quota="uniform")
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion", config=config)
    trainer.train()
    assert "ExampleWeightedForward" in calls  # the weighted path still runs TRL's compute_loss
    after = [h for h in trainer.state.log_history if "loss" in h and h.get("step", 0) > 1]
    assert len(after) == 4 and all("entropy" in h and "mean_token_accuracy" in h for h in after)

    kept = trainer.selection.indices[:6]
    weights = trainer.selection_run.dense_loss_weights[torch.as_tensor(kept)]
    assert not torch.all(weights == 1)
    batch = trainer.data_collator([{k: trainer.train_dataset[int(i)][k] for k in ("input_ids", "labels")}
                                   for i in kept])
    model = trainer.model.eval()
    ours = trainer.compute_loss(model, {**batch, INDEX_KEY: torch.as_tensor(kept)})
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = weighted_token_loss(logits, batch["labels"], weights, shift=True)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_sft_hooks_are_called(tmp_path, chat_lm, chat_tokenizer, monkeypatch):
    calls = []
    for name in ("set_initial_training_values", "_init_training_state", "_run_epoch", "get_train_dataloader",
                 "compute_loss", "_cs_weighted_loss", "create_model_card"):
        original = getattr(ClusterSFTTrainer, name)

        def spy(self, *a, _original=original, _name=name, **k):
            calls.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(ClusterSFTTrainer, name, spy)
    config = hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=4, quota="uniform")
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion", config=config, cls=ClusterSFTTrainer,
                    save_strategy="steps", save_steps=3)
    trainer.train()
    for name in ("set_initial_training_values", "_init_training_state", "_run_epoch", "get_train_dataloader",
                 "compute_loss", "_cs_weighted_loss", "create_model_card"):
        assert name in calls, f"transformers/TRL no longer calls {name}"
    card = (tmp_path / "out" / "README.md").read_text()  # TRL's _save_checkpoint wrote it, with our section
    assert "It has been trained using [TRL]" in card and card.count(START_MARKER) == 1


def test_truncation_drops_are_counted_and_reported(tmp_path, chat_lm, chat_tokenizer):
    rows = pairs(40)
    long_prompt = " ".join(PROMPT_WORDS * 2)  # 30 words: alone fills max_length=24
    rows = [(long_prompt, c) if i % 5 == 0 else (p, c) for i, (p, c) in enumerate(rows)]  # 8 of 40
    trainer = build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion", rows=rows, max_length=24)
    assert trainer.n_dropped_by_preparation == 8 and len(trainer.train_dataset) == 32
    assert all(trainer.train_dataset[i]["source_id"] % 5 for i in range(32))
    trainer.train()
    assert trainer.step_plan.n_examples == 32 and trainer.step_plan.n_kept == 16
    assert trainer.selection_report.n_dropped_by_preparation == 8
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| Dropped before selection | 8 |" in card


def test_too_many_drops_fail_before_model_work(tmp_path, chat_lm, chat_tokenizer):
    rows = pairs(40)
    long_prompt = " ".join(PROMPT_WORDS * 2)
    rows = [(long_prompt, c) if i % 5 in (0, 1) else (p, c) for i, (p, c) in enumerate(rows)]  # 16 of 40
    before = [p.detach().clone() for p in chat_lm.parameters()]
    with pytest.raises(ValueError, match=r"16 of 40 training examples \(40.0%\).*max_dropped_fraction=0.25"):
        build(tmp_path, chat_lm, chat_tokenizer, "prompt_completion", rows=rows, max_length=24)
    assert all(torch.equal(a, b) for a, b in zip(before, chat_lm.parameters()))
    trainer = ClusterSFTTrainer(
        model=chat_lm, args=sft_args(tmp_path, max_length=24), train_dataset=make_dataset("prompt_completion", rows),
        processing_class=chat_tokenizer, max_dropped_fraction=0.5,
    )
    assert trainer.n_dropped_by_preparation == 16 and len(trainer.train_dataset) == 24


def test_tokenized_examples_without_loss_are_dropped(tmp_path, chat_lm, chat_tokenizer):
    vocab = chat_tokenizer.get_vocab()
    encoded = [expected_tokens("prompt_completion", p, c, vocab) for p, c in pairs()]
    labels = [[-100] * len(ids) if i in (3, 9) else mask for i, (ids, mask) in enumerate(encoded)]
    data = Dataset.from_dict({"input_ids": [ids for ids, _ in encoded], "labels": labels})
    trainer = ClusterSFTTrainer(model=chat_lm, args=sft_args(tmp_path, max_length=None), train_dataset=data,
                                processing_class=chat_tokenizer)
    assert trainer.sft_format == "tokenized" and trainer.n_dropped_by_preparation == 2
    assert len(trainer.train_dataset) == 30


@pytest.mark.parametrize(
    "data, overrides, message",
    [
        (DatasetDict(train=make_dataset("text", pairs(8)), test=make_dataset("text", pairs(4))), {},
         r"dict of splits \(\['test', 'train'\]\).*dataset\['train'\]"),
        (Dataset.from_dict({"prompt": ["a"], "source_id": [0]}), {},
         r"no 'completion' column \(columns found: \['prompt', 'source_id'\]\)"),
        (Dataset.from_dict({"question": ["a"], "answer": ["b"]}), {}, r"columns found: \['answer', 'question'\]"),
        (Dataset.from_dict({"text": []}), {}, "is empty"),
        (make_dataset("text", pairs(8)).to_iterable_dataset(), {}, "map-style"),
        (make_dataset("text", pairs(8)), {"packing": True}, "packing=True"),
        (make_dataset("text", pairs(8)), {"padding_free": True, "max_length": None}, "padding_free=True"),
        (make_dataset("text", pairs(8)), {"loss_type": "dft"}, "loss_type='nll'"),
    ],
    ids=["dataset_dict", "missing_completion", "no_format", "empty", "iterable", "packing", "padding_free", "dft"],
)
def test_dataset_and_setting_errors_before_model_loading(tmp_path, chat_tokenizer, data, overrides, message):
    # the model is a Hub id that cannot be loaded offline: the error must come before TRL tries to load it
    with pytest.raises(ValueError, match=message):
        ClusterSFTTrainer(model="nobody/no-such-model", args=sft_args(tmp_path, **overrides), train_dataset=data,
                          processing_class=chat_tokenizer)
    assert not os.path.exists(tmp_path / "out")


def test_loss_tokens_context_rejected_for_classifiers(tmp_path, tokenizer):
    import tiny_assets
    from transformers import LlamaForSequenceClassification, Trainer, TrainingArguments

    from hf_cluster_select import ClusterTrainer

    model = LlamaForSequenceClassification(tiny_assets.llama_config(
        len(tokenizer), num_hidden_layers=1, pad_token_id=tokenizer.pad_token_id, num_labels=2,
    ))
    data = Dataset.from_dict({"input_ids": [[4, 5, 6]] * 16, "labels": [0, 1] * 8})
    trainer = ClusterTrainer(
        model=model, args=TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[]),
        train_dataset=data, cluster_config=hdbscan_config(feature_context="loss_tokens"),
    )
    assert isinstance(trainer, Trainer)
    with pytest.raises(ValueError, match="feature_context='loss_tokens'"):
        trainer.plan()


def test_loss_tokens_collator_keeps_loss_bearing_tokens_only():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from hf_cluster_select.data import LossTokensCollator

    collate = LossTokensCollator(DataCollatorForLanguageModeling(pad_token_id=0), bos_token_id=3)
    batch = collate([
        {"input_ids": [7, 8, 9, 10, 11], "labels": [-100, -100, 9, 10, 11]},  # prompt 7 8
        {"input_ids": [4, 9, 5, 12, 2], "labels": [-100, 9, -100, 12, 2]},  # two assistant turns: 9, then 12 2
        {"input_ids": [6, 6], "labels": [-100, -100]},  # nothing carries loss: unchanged
    ])
    assert batch["input_ids"].tolist() == [[3, 9, 10, 11], [3, 9, 12, 2], [6, 6, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 9, 10, 11], [-100, 9, 12, 2], [-100, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_doubled_eos_is_warned(tmp_path, chat_lm, chat_tokenizer, caplog):
    from tokenizers.processors import TemplateProcessing

    tokenizer = copy.deepcopy(chat_tokenizer)
    eos = tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="$A [EOS]", special_tokens=[("[EOS]", eos)])
    assert tokenizer("add")["input_ids"][-1] == eos
    with caplog.at_level("WARNING", logger="hf_cluster_select.integrations.sft"):
        ClusterSFTTrainer(model=chat_lm, args=sft_args(tmp_path), train_dataset=make_dataset("text", pairs()),
                          processing_class=tokenizer)
    assert "doubled EOS" in caplog.text


@pytest.mark.parametrize("fmt", ["prompt_completion", "messages"])
def test_raw_target_is_prepared_like_the_training_data(tmp_path, chat_lm, chat_tokenizer, fmt):
    """`target_dataset` given as raw rows (TRL's format, with a task column): tokenized and masked as TRL prepared
    `train_dataset`, each task gets half the budget; a target in another format is refused before model work."""
    target = make_dataset(fmt, pairs(4, seed=1)).add_column("skill", ["s1", "s1", "s2", "s2"])
    config = ClusterSelectConfig(data_fraction=0.25, selection_warmup_steps=0, strategy_kwargs={"target_column": "skill"})
    extra = {"assistant_only_loss": True} if fmt == "messages" else {}
    trainer = ClusterSFTTrainer(model=chat_lm, args=sft_args(tmp_path, **extra),
                                train_dataset=make_dataset(fmt, pairs()), processing_class=chat_tokenizer,
                                target_dataset=target, cluster_config=config)
    trainer.train()
    assert trainer.selection.n_kept == 8
    assert trainer.selection_report.target["task_names"] == ["s1", "s2"]
    assert trainer.selection_report.target["kept_per_task"] == [4, 4]
    other = make_dataset("text", pairs(4, seed=1)).add_column("skill", ["s1", "s1", "s2", "s2"])
    refused = ClusterSFTTrainer(model=chat_lm, args=sft_args(tmp_path, **extra),
                                train_dataset=make_dataset(fmt, pairs()), processing_class=chat_tokenizer,
                                target_dataset=other, cluster_config=config)
    with pytest.raises(ValueError, match="not in the training data's format"):
        refused.train()
