"""The other feature signals (`badge`, `hidden_mean`) and the norms / losses every signal returns, against autograd
and plain forward passes on tiny models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_features import HIDDEN, VOCAB, causal_lm, classification_data, collate, make_examples  # noqa: F401
from transformers import BertConfig, BertForSequenceClassification

from hf_cluster_select.features import FEATURES, badge_features, hidden_mean_features, last_layer_grad_features
from hf_cluster_select.features.badge import PROJECTED_CLASSES


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    return BertForSequenceClassification(config).eval()


def test_badge_is_the_whole_last_layer_gradient(classifier):
    data = classification_data()
    out = badge_features(classifier, data, list(range(len(data))), collate, normalize=False, show_progress=False)
    assert out.features.shape == (len(data), 3 * HIDDEN)
    head = classifier.classifier
    for i, x in enumerate(data):
        with torch.no_grad():
            pooled = classifier.bert(input_ids=torch.tensor([x["input_ids"]])).pooler_output
        weight = head.weight.detach().clone().requires_grad_(True)
        F.cross_entropy(pooled @ weight.T + head.bias.detach(), torch.tensor([x["labels"]])).backward()
        torch.testing.assert_close(out.features[i], weight.grad.reshape(-1), atol=1e-5, rtol=0)
        assert out.norms[i].item() == pytest.approx(weight.grad.norm().item(), rel=1e-5)
        with torch.no_grad():
            loss = F.cross_entropy(classifier(input_ids=torch.tensor([x["input_ids"]])).logits,
                                   torch.tensor([x["labels"]]))
        assert out.losses[i].item() == pytest.approx(loss.item(), rel=1e-5)


def test_badge_separates_classes_that_the_row_slice_merges(classifier):
    """Two copies of one input with different labels: identical (p_y − 1)·h directions up to sign, but BADGE
    vectors that differ in which class row carries the residual."""
    x = classification_data()[0]
    data = [dict(x, labels=0), dict(x, labels=1)]
    badge = badge_features(classifier, data, [0, 1], collate, show_progress=False).features
    assert (badge[0] - badge[1]).abs().max() > 0.1


def test_badge_projects_a_large_vocabulary(causal_lm, monkeypatch):
    from hf_cluster_select.features import badge

    monkeypatch.setattr(badge, "EXACT_MAX_CLASSES", VOCAB - 1)  # the tiny LM's 64 tokens count as "large"
    data = make_examples()
    out = badge_features(causal_lm, data, list(range(len(data))), collate, show_progress=False)
    assert out.features.shape == (len(data), PROJECTED_CLASSES * HIDDEN) and torch.isfinite(out.features).all()
    again = badge_features(causal_lm, data, list(range(len(data))), collate, show_progress=False)
    assert torch.equal(out.features, again.features)  # seeded projection


def test_hidden_mean_is_the_mean_head_input(causal_lm):
    data = make_examples()
    out = hidden_mean_features(causal_lm, data, list(range(len(data))), collate, normalize=False, show_progress=False)
    for i, x in enumerate(data):
        with torch.no_grad():
            h = causal_lm.model(input_ids=torch.tensor([x["input_ids"]])).last_hidden_state[0]
        keep = torch.tensor(x["labels"])[1:] != -100
        torch.testing.assert_close(out.features[i], h[:-1][keep].mean(0), atol=1e-5, rtol=0)


def test_hidden_weighted_mean_weighs_the_t_th_loss_token_t(causal_lm):
    """RDS+'s pooling: sum_t t · h_t / c over the c loss-bearing tokens (the position-weighted mean's direction)."""
    data = make_examples()
    out = FEATURES.get("hidden_weighted_mean")(causal_lm, data, list(range(len(data))), collate, normalize=False,
                                               show_progress=False)
    for i, x in enumerate(data):
        with torch.no_grad():
            h = causal_lm.model(input_ids=torch.tensor([x["input_ids"]])).last_hidden_state[0]
        tokens = h[:-1][torch.tensor(x["labels"])[1:] != -100]
        ranks = torch.arange(1, tokens.shape[0] + 1, dtype=torch.float32)
        torch.testing.assert_close(out.features[i], (ranks[:, None] * tokens).sum(0) / tokens.shape[0], atol=1e-5,
                                   rtol=0)


def test_losses_and_norms_of_the_causal_proxy(causal_lm):
    data = make_examples()
    raw = last_layer_grad_features(causal_lm, data, list(range(len(data))), collate, normalize=False,
                                   show_progress=False)
    normalised = last_layer_grad_features(causal_lm, data, list(range(len(data))), collate, show_progress=False)
    torch.testing.assert_close(raw.norms, raw.features.norm(dim=1))
    torch.testing.assert_close(normalised.features * raw.norms[:, None], raw.features, atol=1e-5, rtol=0)
    for i, x in enumerate(data):
        ids, labels = torch.tensor([x["input_ids"]]), torch.tensor([x["labels"]])
        with torch.no_grad():
            loss = causal_lm(input_ids=ids, labels=labels).loss  # transformers' shifted token mean
        assert raw.losses[i].item() == pytest.approx(loss.item(), rel=1e-5)


def test_every_signal_is_registered():
    assert FEATURES.names() == ["last_layer_grad", "badge", "hidden_mean", "hidden_weighted_mean"]
