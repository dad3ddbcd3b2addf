"""Deterministic tiny assets for tests that run in other processes (torchrun workers): a WordLevel tokenizer trained
locally, a 2-layer hidden-32 Llama built from config, pseudo-sentence datasets of variable length. No network.

They match the fixtures of `conftest.py` (same vocabulary, same tokenizer, same model config and seed), so a worker
process and the pytest process build bit-identical models and data.
"""

from __future__ import annotations

import random

WORDS = (
    "add subtract multiply divide number total sum answer question what is the of and price cost apple "
    "train speed hour minute distance percent ratio area circle square triangle side length width"
).split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """`n` short pseudo-sentences (4-14 words) from a fixed vocabulary, in two styles (two 'skills')."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        k = rng.randint(4, 14)
        words = rng.sample(WORDS[:18], k=min(k, 18)) if i % 2 == 0 else rng.choices(WORDS[18:], k=k)
        texts.append(" ".join(words))
    return texts


def build_tokenizer():
    """A WordLevel tokenizer trained locally, with distinct pad / eos / bos tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [" ".join(WORDS)] * 3, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]", "[BOS]"])
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]", bos_token="[BOS]"
    )


def llama_config(vocab_size: int, **overrides):
    """The one tiny Llama shape of the test suite: hidden 32, 2 layers, 4 heads (4 KV heads), 64 positions, untied
    embeddings; `overrides` change any field (token ids, `num_labels`, longer positions)."""
    from transformers import LlamaConfig

    values = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False)
    values.update(overrides)
    return LlamaConfig(**values)


def build_model(tokenizer, seed: int = 0):
    """A 2-layer, hidden-32 Llama initialised from `torch.manual_seed(seed)` (identical in every process)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id))


def build_dataset(tokenizer, n: int = 96, seed: int = 0):
    """`n` tokenized examples (`input_ids`, `attention_mask`, `labels` with the first two tokens masked)."""
    from datasets import Dataset

    enc = tokenizer(make_texts(n, seed))
    labels = [[-100, -100] + ids[2:] for ids in enc["input_ids"]]
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


def build_collator(tokenizer):
    """Right-padding collator (labels padded with -100)."""
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


# The v0.1 pipeline (CluSTER's target-row proxy, HDBSCAN, peripheral members) that the clustering, reliability and
# TRL tests were written against; the defaults changed with the quality benchmark (README, "Selection quality").
HDBSCAN_PIPELINE = dict(feature="last_layer_grad", cluster_method="hdbscan", within_cluster="peripheral")


def config_with(**values):
    """`ClusterSelectConfig.from_flat(values)`: a key that is not a field is a strategy setting."""
    from hf_cluster_select import ClusterSelectConfig

    return ClusterSelectConfig.from_flat(values)


def hdbscan_config(**overrides):
    """`ClusterSelectConfig` of the HDBSCAN pipeline (`HDBSCAN_PIPELINE`), with `overrides` on top (strategy
    settings such as `hdbscan_min_cluster_size` too, see `config_with`)."""
    return config_with(**{**HDBSCAN_PIPELINE, **overrides})


def run_facts(**values):
    """`RunFacts` of a causal LM run for tests that build a `SelectionRun` without a model (`values` override)."""
    from hf_cluster_select._types import RunFacts

    defaults = dict(shift_labels=True, feature="hidden_mean", feature_layers=None, feature_used="hidden_mean",
                    loss_weighted=True)
    if values.get("strata") is not None:
        values["strata"] = tuple(values["strata"])
    return RunFacts(**{**defaults, **values})
