"""Shared fixtures: a tiny causal LM built from config, a tokenizer trained locally, small datasets. No network."""

from __future__ import annotations

import copy
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

WORDS = (
    "add subtract multiply divide number total sum answer question what is the of and price cost apple "
    "train speed hour minute distance percent ratio area circle square triangle side length width"
).split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """`n` short pseudo-sentences from a fixed vocabulary, in two styles (two 'skills')."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        k = rng.randint(4, 14)
        words = rng.sample(WORDS[:18], k=min(k, 18)) if i % 2 == 0 else rng.choices(WORDS[18:], k=k)
        texts.append(" ".join(words))
    return texts


@pytest.fixture(scope="session")
def tokenizer():
    """A WordLevel tokenizer trained locally, with distinct pad / eos tokens."""
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


@pytest.fixture(scope="session")
def _tiny_lm_base(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


@pytest.fixture
def tiny_lm(_tiny_lm_base):
    """A fresh deep copy of a 2-layer, hidden-32 Llama per test."""
    return copy.deepcopy(_tiny_lm_base)


@pytest.fixture(scope="session")
def lm_dataset(tokenizer):
    """96 tokenized examples (`input_ids`, `attention_mask`, `labels` with the first two tokens masked)."""
    from datasets import Dataset

    texts = make_texts(96)
    enc = tokenizer(texts)
    labels = [[-100, -100] + ids[2:] for ids in enc["input_ids"]]
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


@pytest.fixture(scope="session")
def collator(tokenizer):
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
