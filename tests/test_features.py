"""Tests of hf_cluster_select.features: exact match of the last-layer gradient signal against autograd."""

from __future__ import annotations

import copy

import pytest
import torch
import tiny_assets
import torch.nn.functional as F
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    T5Config,
    T5ForConditionalGeneration,
)

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.features import FeatureOutput, RandomProjection, last_layer_grad_features

torch.set_num_threads(1)
VOCAB, HIDDEN, PAD = 64, 32, 0


def llama_config(**kwargs) -> LlamaConfig:
    return tiny_assets.llama_config(VOCAB, **kwargs)


@pytest.fixture(scope="module")
def causal_lm() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(llama_config()).eval()


@pytest.fixture
def lm(causal_lm) -> LlamaForCausalLM:
    return copy.deepcopy(causal_lm)


def make_examples(n: int = 6, seed: int = 1) -> list[dict]:
    """Variable-length token sequences; the first 2 tokens are a prompt (label -100)."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(n):
        length = 4 + (i * 5) % 9
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        examples.append({"input_ids": ids, "labels": [-100, -100] + ids[2:]})
    return examples


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad with PAD (labels with -100); extra keys of the items are passed through."""
    width = max(len(x["input_ids"]) for x in items)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for x in items:
        pad = width - len(x["input_ids"])
        batch["input_ids"].append(list(x["input_ids"]) + [PAD] * pad)
        batch["attention_mask"].append([1] * len(x["input_ids"]) + [0] * pad)
        if isinstance(x.get("labels"), list):
            batch["labels"].append(x["labels"] + [-100] * pad)
        elif "labels" in x:  # a class id
            batch["labels"].append(x["labels"])
    out = {k: torch.tensor(v) for k, v in batch.items() if v}
    out["unused_column"] = torch.zeros(len(items))  # must be dropped silently
    return out


def reference_row(h: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of row y_t of d CE_t / d W by autograd, L2-normalised. h: [T, H], targets: [T]."""
    rows = []
    for t in range(h.shape[0]):
        w = weight.detach().clone().requires_grad_(True)
        logits = h[t] @ w.T + (bias.detach() if bias is not None else 0)
        F.cross_entropy(logits[None], targets[t : t + 1]).backward()
        rows.append(w.grad[targets[t]])
    mean = torch.stack(rows).mean(0)
    return mean / mean.norm()


def run(model, data, indices=None, **kwargs) -> FeatureOutput:
    indices = list(range(len(data))) if indices is None else indices
    kwargs.setdefault("show_progress", False)
    return last_layer_grad_features(model, data, indices, collate, **kwargs)


def test_causal_lm_matches_autograd(lm):
    data = make_examples()
    out = run(lm, data, batch_size=4)
    assert out.features.shape == (len(data), HIDDEN) and out.features.dtype == torch.float32
    assert out.seconds > 0
    for i, x in enumerate(data):
        ids = torch.tensor([x["input_ids"]])
        with torch.no_grad():
            h = lm.model(input_ids=ids).last_hidden_state[0]  # [T, H], after the final norm
            torch.testing.assert_close(h @ lm.lm_head.weight.T, lm(input_ids=ids).logits[0], atol=1e-5, rtol=0)
        labels = torch.tensor(x["labels"])[1:]
        keep = labels != -100
        expected = reference_row(h[:-1][keep], lm.lm_head.weight, None, labels[keep])
        torch.testing.assert_close(out.features[i], expected, atol=1e-5, rtol=0)
        assert out.loss_tokens[i].item() == int(keep.sum())


def test_labels_matter_and_count(lm):
    data = make_examples(2)
    changed = copy.deepcopy(data)
    changed[0]["labels"][1] = changed[0]["input_ids"][1]  # unmask one prompt token
    base, new = run(lm, data), run(lm, changed)
    assert new.loss_tokens[0] == base.loss_tokens[0] + 1
    assert not torch.allclose(base.features[0], new.features[0], atol=1e-4)
    torch.testing.assert_close(base.features[1], new.features[1])
    no_loss = [{"input_ids": [5, 6, 7], "labels": [-100, -100, -100]}]
    out = run(lm, no_loss)
    assert out.loss_tokens.tolist() == [0] and torch.count_nonzero(out.features) == 0


def test_without_labels_uses_input_ids(lm):
    data = [{"input_ids": x["input_ids"]} for x in make_examples(3)]
    out = run(lm, data, batch_size=3)
    assert out.loss_tokens.tolist() == [len(x["input_ids"]) - 1 for x in data]
    full = [{"input_ids": x["input_ids"], "labels": x["input_ids"]} for x in data]
    torch.testing.assert_close(out.features, run(lm, full, batch_size=1).features, atol=1e-5, rtol=0)


def test_order_and_batch_size_invariance(lm):
    data = make_examples(6)
    whole = run(lm, data, batch_size=4)
    part = run(lm, data, indices=[3, 0, 2], batch_size=2)
    torch.testing.assert_close(part.features, whole.features[[3, 0, 2]], atol=1e-5, rtol=0)
    assert part.loss_tokens.tolist() == whole.loss_tokens[[3, 0, 2]].tolist()
    single = run(lm, data, batch_size=1, lengths=[len(x["input_ids"]) for x in data])
    torch.testing.assert_close(single.features, whole.features, atol=1e-5, rtol=0)


def test_projection_applied_before_normalisation(lm):
    data = make_examples(4)
    raw = run(lm, data, normalize=False)
    projection = RandomProjection(HIDDEN, 8, seed=3)
    projected = run(lm, data, projection=projection)
    expected = projection(raw.features)
    torch.testing.assert_close(projected.features, expected / expected.norm(dim=1, keepdim=True), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="`projection`"):
        run(lm, data, projection=RandomProjection(HIDDEN + 1, 8, seed=0))


def test_training_mode_and_hooks_restored(lm):
    lm.train()
    lm.model.layers[0].eval()
    modes = [m.training for m in lm.modules()]
    run(lm, make_examples(2))
    assert [m.training for m in lm.modules()] == modes
    assert all(not m._forward_hooks for m in lm.modules())

    def failing_collate(items):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        last_layer_grad_features(lm, make_examples(2), [0, 1], failing_collate, show_progress=False)
    assert [m.training for m in lm.modules()] == modes
    assert all(not m._forward_hooks for m in lm.modules())


def test_peft_model_matches_merged(lm):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(lm, config)
    data = make_examples(4)
    out = run(model, data, batch_size=2)
    assert all(not m._forward_hooks for m in model.modules())
    merged = run(model.merge_and_unload(), data, batch_size=2)
    torch.testing.assert_close(out.features, merged.features, atol=1e-5, rtol=0)


def classification_data(n: int = 5) -> list[dict]:
    return [{"input_ids": x["input_ids"], "labels": i % 3} for i, x in enumerate(make_examples(n))]


def test_bert_sequence_classification_matches_autograd():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=3,
    )  # fmt: skip
    model = BertForSequenceClassification(config).eval()
    data = classification_data()
    out = run(model, data, batch_size=4)
    assert out.features.shape == (len(data), HIDDEN) and torch.isfinite(out.features).all()
    assert out.loss_tokens.tolist() == [1] * len(data)
    for i, x in enumerate(data):
        with torch.no_grad():
            pooled = model.bert(input_ids=torch.tensor([x["input_ids"]])).pooler_output
        head = model.classifier
        expected = reference_row(pooled, head.weight, head.bias, torch.tensor([x["labels"]]))
        torch.testing.assert_close(out.features[i], expected, atol=1e-5, rtol=0)


def test_llama_sequence_classification_pools_last_token():
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(llama_config(num_labels=3, pad_token_id=PAD)).eval()
    data = classification_data()
    out = run(model, data, batch_size=4)
    assert out.features.shape == (len(data), HIDDEN)
    for i, x in enumerate(data):
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([x["input_ids"]])).last_hidden_state[0, -1:]
        expected = reference_row(h, model.score.weight, None, torch.tensor([x["labels"]]))
        torch.testing.assert_close(out.features[i], expected, atol=1e-5, rtol=0)
    unlabeled = run(model, [{"input_ids": x["input_ids"]} for x in data], batch_size=4)  # BADGE: predicted class
    assert torch.isfinite(unlabeled.features).all() and unlabeled.loss_tokens.tolist() == [1] * len(data)


def _encoder_decoder_classifier(name: str) -> torch.nn.Module:
    """A tiny BART or T5 sequence classifier (3 labels; EOS 2, PAD 0): its head is `classification_head`, dense →
    tanh → `out_proj`, on the decoder's state at the last EOS."""
    import transformers

    small = dict(vocab_size=VOCAB, num_labels=3, pad_token_id=PAD, eos_token_id=2, decoder_start_token_id=PAD)
    if name == "bart":
        config = transformers.BartConfig(d_model=HIDDEN, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_position_embeddings=64, bos_token_id=3, forced_eos_token_id=None, **small)
        return transformers.BartForSequenceClassification(config).eval()
    config = transformers.T5Config(d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=1, num_heads=4, **small)
    return transformers.T5ForSequenceClassification(config).eval()


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_encoder_decoder_sequence_classification_heads_are_recognised(name):
    """BART's and T5's `classification_head`: the signal is the last-layer gradient of its `out_proj` (the input
    `h` is the pooled EOS state after dense → tanh), row for row what autograd gives on each example alone; it
    counts as a classification head (feature "auto" → BADGE, the near-duplicate check on)."""
    from hf_cluster_select.features.head_tokens import resolve_head
    from hf_cluster_select.pipeline import with_auto_resolved

    torch.manual_seed(0)
    model = _encoder_decoder_classifier(name)
    assert resolve_head(model) == (model.classification_head.out_proj, False)
    settings = with_auto_resolved(ClusterSelectConfig(), model, "badge").selection_settings
    assert (settings.near_duplicate_threshold, settings.duplicate_weight) == (0.7, "one")
    data = [{"input_ids": [t % (VOCAB - 3) + 3 for t in x["input_ids"]] + [2], "labels": x["labels"]}
            for x in classification_data()]  # one EOS at the end of each example, none elsewhere
    out = run(model, data, batch_size=4)
    assert out.features.shape == (len(data), HIDDEN) and out.loss_tokens.tolist() == [1] * len(data)
    head = model.classification_head.out_proj
    for i, x in enumerate(data):
        captured = []
        hook = head.register_forward_hook(lambda module, args, output: captured.append(args[0].detach()))
        with torch.no_grad():
            model(input_ids=torch.tensor([x["input_ids"]]))
        hook.remove()
        expected = reference_row(captured[0], head.weight, head.bias, torch.tensor([x["labels"]]))
        torch.testing.assert_close(out.features[i], expected, atol=1e-5, rtol=0)


def test_encoder_decoder_does_not_shift():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=PAD,
        pad_token_id=PAD,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config).eval()
    data = make_examples(3)
    out = run(model, data, batch_size=3)
    assert out.loss_tokens.tolist() == [sum(y != -100 for y in x["labels"]) for x in data]
    assert torch.isfinite(out.features).all() and out.features.shape == (3, HIDDEN)


def test_bad_inputs(lm):
    data = make_examples(3)
    with pytest.raises(ValueError, match="`indices`"):
        run(lm, data, indices=[])
    with pytest.raises(ValueError, match="`indices`"):
        run(lm, data, indices=[0, 3])
    with pytest.raises(ValueError, match="`indices`"):
        run(lm, data, indices=[-1])
    with pytest.raises(TypeError, match="`indices`"):
        run(lm, data, indices=[0.5])
    with pytest.raises(ValueError, match="`batch_size`"):
        run(lm, data, batch_size=0)
    with pytest.raises(ValueError, match="`lengths`"):
        run(lm, data, lengths=[3, 4])
    with pytest.raises(TypeError, match="`model`"):
        last_layer_grad_features(object(), data, [0], collate)
    with pytest.raises(TypeError, match="`collate_fn`"):
        last_layer_grad_features(lm, data, [0], None)
    with pytest.raises(TypeError, match="`model`"):
        run(torch.nn.Linear(2, 2), data)


def test_random_projection():
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(0))
    p = RandomProjection(64, 256, seed=7)
    y = p(x)
    assert y.shape == (200, 256) and y.dtype == torch.float32
    torch.testing.assert_close(RandomProjection(64, 256, seed=7)(x), y)
    assert not torch.allclose(RandomProjection(64, 256, seed=8)(x), y)
    ratio = (y.norm(dim=1) ** 2 / x.norm(dim=1) ** 2).mean().item()
    assert abs(ratio - 1.0) < 0.05
    assert p(x.double()).dtype == torch.float32
    for kwargs, name in (({"in_dim": 0, "out_dim": 4}, "in_dim"), ({"in_dim": 4, "out_dim": 0}, "out_dim")):
        with pytest.raises(ValueError, match=f"`{name}`"):
            RandomProjection(**kwargs, seed=0)
    with pytest.raises(TypeError, match="`seed`"):
        RandomProjection(4, 4, seed=1.5)
    with pytest.raises(ValueError, match="`x`"):
        p(torch.zeros(3, 63))


def test_pooled_position_falls_back_to_the_pooled_row():
    from hf_cluster_select.features.head_tokens import _pooled_positions

    head_out = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    logits = head_out[[0, 1], [2, 4]]  # row 0 pooled somewhere other than the last position
    assert _pooled_positions(head_out, logits, None, None).tolist() == [2, 4]
    input_ids = torch.tensor([[4, 5, 6, 0, 0], [4, 5, 6, 7, 8]])
    assert _pooled_positions(head_out, logits, input_ids, 0).tolist() == [2, 4]


@pytest.mark.parametrize("name", ["last_layer_grad", "badge", "hidden_mean"])
def test_loss_position_head_matches_full_logits(lm, name):
    """The head applied only at the loss-bearing positions gives the features, norms and losses of the full
    `[B, T, V]` logits to 1e-5 (fp32), for every built-in signal."""
    from hf_cluster_select.features import FEATURES

    examples = make_examples(9, seed=4)
    run = FEATURES.get(name)
    fast = run(lm, examples, list(range(9)), collate, batch_size=3, show_progress=False)
    full = run(lm, examples, list(range(9)), collate, batch_size=3, show_progress=False, gather_loss_positions=False)
    assert torch.allclose(fast.features, full.features, atol=1e-5)
    assert torch.allclose(fast.norms, full.norms, rtol=1e-5, atol=1e-6)
    assert torch.allclose(fast.losses, full.losses, atol=1e-5)
    assert torch.equal(fast.loss_tokens, full.loss_tokens)


def test_head_runs_only_on_loss_tokens(lm):
    """The LM head's input holds exactly the loss-bearing tokens (shifted): no logits for prompt or padding."""
    examples = make_examples(6)
    rows_seen = []
    handle = lm.lm_head.register_forward_hook(lambda m, args, out: rows_seen.append(tuple(out.shape)))
    try:
        out = last_layer_grad_features(lm, examples, list(range(6)), collate, batch_size=6, show_progress=False)
    finally:
        handle.remove()
    expected = sum(len(x["input_ids"]) - 2 for x in examples)  # labels[t + 1] for t >= 1: all but the prompt
    assert int(out.loss_tokens.sum()) == expected
    assert sum(shape[0] for shape in rows_seen) == expected and all(len(s) == 2 for s in rows_seen)


def test_token_batches_pack_by_padded_tokens():
    """Longest first; every position once; padded tokens within batch_size × the longest length; at most 4 × the
    batch size; short examples share batches, so there are fewer batches than with a fixed count."""
    from hf_cluster_select.features.inputs import token_batches

    lengths = [100, 90, 10, 12, 11, 9, 50, 8, 7, 100, 10, 10, 10, 10, 10, 10, 10]
    batches = token_batches(lengths, batch_size=2)
    assert sorted(k for b in batches for k in b) == list(range(len(lengths)))
    assert batches[0] == [0, 9]  # the two longest (stable order)
    for batch in batches:
        assert len(batch) <= 8 and len(batch) * max(lengths[k] for k in batch) <= 2 * 100
    assert len(batches) < -(-len(lengths) // 2)
    assert token_batches([5, 5, 5], batch_size=1) == [[0], [1], [2]]
    assert token_batches([], batch_size=3) == []
