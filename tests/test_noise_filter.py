"""The noise filter (`selection/noise_filter.py`, `SelectionSettings.noise_share`): k-NN agreement values, the flagged
rows, the input states of the feature pass it reads, and where selection and the config take it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_features import HIDDEN, causal_lm, classification_data, collate, make_examples  # noqa: F401
from test_feature_signals import classifier  # noqa: F401

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select._types import ClusteringResult
from hf_cluster_select.features import badge_features, hidden_mean_features
from hf_cluster_select.selection import select_subset
from hf_cluster_select.selection.noise_filter import neighbour_agreement, suspected_noise


def _two_topics(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs: rows 0-9 near e0, rows 10-19 near e1 (small jitter); features: e0 for rows 0-9, e1 for rows 10-19,
    except row 3 (input of topic 0, feature of topic 1) and row 15 (the reverse): the two mislabelled rows."""
    rng = np.random.default_rng(seed)
    inputs = np.zeros((20, 4))
    inputs[:10, 0], inputs[10:, 1] = 1.0, 1.0
    inputs += 0.01 * rng.standard_normal(inputs.shape)
    features = np.zeros((20, 3))
    features[:10, 0], features[10:, 1] = 2.0, 2.0  # any scale: rows are normalised
    features[3], features[15] = [0, 5.0, 0], [1.0, 0, 0]
    return inputs, features


def test_agreement_values_and_flagged_rows():
    inputs, features = _two_topics()
    agreement = neighbour_agreement(inputs, features, neighbors=3)
    # the mislabelled rows' 3 neighbours are clean rows of their input's topic, whose features are orthogonal
    assert agreement[3] == pytest.approx(0.0, abs=1e-6) and agreement[15] == pytest.approx(0.0, abs=1e-6)
    clean = np.setdiff1d(np.arange(20), [3, 15])
    assert agreement[clean].min() >= 2 / 3 - 1e-6  # at most one mislabelled neighbour among 3
    assert suspected_noise(agreement, 0.1).nonzero()[0].tolist() == [3, 15]
    assert suspected_noise(agreement, 0.0).sum() == 0


def test_agreement_excludes_the_example_itself_and_zero_inputs():
    features = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    inputs = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 0.0]])  # row 2 has no loss-bearing token
    agreement = neighbour_agreement(inputs, features, neighbors=1)
    assert agreement[:2] == pytest.approx([0.6, 0.6])  # each other's neighbour, not their own (1.0)
    assert np.isinf(agreement[2])
    assert suspected_noise(agreement, 0.9).tolist() == [True, True, False]  # inf is never flagged
    assert np.isinf(neighbour_agreement(inputs[:1], features[:1])).all()  # nobody to compare with


def test_reference_sample_is_seeded_and_bounded():
    inputs, features = _two_topics()
    a = neighbour_agreement(inputs, features, neighbors=2, reference_rows=6, seed=1)
    b = neighbour_agreement(inputs, features, neighbors=2, reference_rows=6, seed=1)
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all() and (np.abs(a) <= 1 + 1e-6).all()


def test_ties_go_to_the_lower_index_and_the_count_is_rounded():
    agreement = np.array([0.5, 0.1, 0.1, 0.9, 0.1])
    assert suspected_noise(agreement, 0.3).nonzero()[0].tolist() == [1, 2]  # 1.5 rounds up to 2: rows 1, 2 before 4
    assert suspected_noise(agreement, 0.5).nonzero()[0].tolist() == [1, 2, 4]


def test_flagging_per_cluster_takes_each_clusters_share():
    """Cluster 7 holds the three lowest agreements, yet each cluster gives up only its own rounded share."""
    agreement = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.6, 0.5])
    clusters = np.array([7, -1, 7, -1, 7, -1, -1, -1])
    assert suspected_noise(agreement, 0.4).nonzero()[0].tolist() == [0, 2, 4]  # 3.2 rows: the pool's lowest three
    # cluster 7: 0.4 * 3 = 1.2 -> row 0; cluster -1 (HDBSCAN noise, one more group): 0.4 * 5 = 2 -> rows 7, 6
    assert suspected_noise(agreement, 0.4, clusters=clusters).nonzero()[0].tolist() == [0, 6, 7]
    with pytest.raises(ValueError, match="clusters"):
        suspected_noise(agreement, 0.4, clusters=clusters[:5])


@pytest.mark.parametrize("kwargs, error, match", [
    ({"neighbors": 0}, ValueError, "neighbors"),
    ({"neighbors": 2.0}, TypeError, "neighbors"),
    ({"reference_rows": 0}, ValueError, "reference_rows"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    inputs, features = _two_topics()
    with pytest.raises(error, match=match):
        neighbour_agreement(inputs, features, **kwargs)


def test_bad_arrays_and_shares_are_named():
    inputs, features = _two_topics()
    with pytest.raises(ValueError, match="features"):
        neighbour_agreement(inputs, features[:5])
    bad = inputs.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="inputs"):
        neighbour_agreement(bad, features)
    for share in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="share"):
            suspected_noise(np.zeros(4), share)


def test_feature_pass_input_states_of_a_classifier_are_its_pooled_output(classifier):  # noqa: F811
    data = classification_data()
    out = badge_features(classifier, data, list(range(len(data))), collate, show_progress=False, input_states=True)
    plain = badge_features(classifier, data, list(range(len(data))), collate, show_progress=False)
    assert plain.inputs is None
    torch.testing.assert_close(out.features, plain.features)  # the option adds, it changes nothing
    assert out.inputs.shape == (len(data), HIDDEN)
    for i, x in enumerate(data):
        with torch.no_grad():
            pooled = classifier.bert(input_ids=torch.tensor([x["input_ids"]])).pooler_output[0]
        torch.testing.assert_close(out.inputs[i], pooled, atol=1e-5, rtol=0)


def test_feature_pass_input_states_of_a_causal_lm_are_the_last_prompt_token(causal_lm):  # noqa: F811
    data = make_examples()  # 2 prompt tokens: the first loss token is predicted at position 1
    data.append({"input_ids": [5, 6, 7], "labels": [-100, -100, -100]})  # no loss-bearing token: a zero row
    out = hidden_mean_features(causal_lm, data, list(range(len(data))), collate, show_progress=False,
                               input_states=True, batch_size=2)
    for i, x in enumerate(data[:-1]):
        with torch.no_grad():
            hidden = causal_lm.model(input_ids=torch.tensor([x["input_ids"]])).last_hidden_state[0, 1]
        torch.testing.assert_close(out.inputs[i], hidden, atol=1e-5, rtol=0)
    assert out.inputs[-1].abs().sum() == 0


def test_select_subset_defers_suspected_rows():
    labels = np.repeat(np.arange(4), 10)  # 4 clusters of 10
    reduced = np.random.default_rng(0).standard_normal((40, 3))
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=reduced, n_clusters=4, method="fine_kmeans")
    suspected = np.zeros(40, dtype=bool)
    suspected[[0, 1, 2, 3, 4, 10, 11, 12, 13, 14]] = True
    config = ClusterSelectConfig(data_fraction=0.5, within_cluster="central")
    chosen = select_subset(result, config, suspected=suspected)
    assert chosen.indices.size == 20 and not suspected[chosen.indices].any()
    # clusters 0 and 1 have 5 candidates each, 2 and 3 have 10: the budget of 20 is split in proportion to them
    assert np.bincount(chosen.labels, minlength=4).tolist() == [3, 3, 7, 7]
    tight = select_subset(result, ClusterSelectConfig(data_fraction=0.9, within_cluster="central"),
                          suspected=suspected)
    assert tight.indices.size == 36 and suspected[tight.indices].sum() == 6  # the budget needs 6 of them


def test_config_refuses_sharded_and_target_with_the_filter():
    with pytest.raises(ValueError, match="noise_share"):
        ClusterSelectConfig(strategy_kwargs={"noise_share": 0.2, "sharded": True})
    with pytest.raises(ValueError, match="noise_share"):
        ClusterSelectConfig(target="eval", strategy_kwargs={"noise_share": 0.2})
    with pytest.raises(ValueError, match="noise_share"):
        ClusterSelectConfig(strategy_kwargs={"noise_share": 1.0})
    with pytest.raises(ValueError, match="noise_neighbors"):
        ClusterSelectConfig(strategy_kwargs={"noise_neighbors": 0})


def test_the_trainer_defers_the_flagged_rows_and_reports_them(tmp_path, tiny_lm, lm_dataset, collator, monkeypatch):
    """End to end on the tiny LM: the rows the filter flags (recorded from the pipeline) are not kept, the report
    and the model card count them, and the cache is bypassed (the input states are not stored)."""
    import copy
    import json

    from transformers import TrainingArguments

    from hf_cluster_select import ClusterTrainer
    from hf_cluster_select.selection import noise_filter

    flagged = []

    def recording(agreement, share, clusters):
        mask = suspected_noise(agreement, share, clusters=clusters)
        flagged.append((mask, np.asarray(clusters)))
        return mask

    monkeypatch.setattr(noise_filter, "suspected_noise", recording)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1,
                             learning_rate=1e-3, warmup_steps=2, save_strategy="no", report_to=[], use_cpu=True,
                             seed=0, disable_tqdm=True)
    config = ClusterSelectConfig(data_fraction=0.5, strategy_kwargs={"noise_share": 0.25, "noise_neighbors": 3})
    untrained = copy.deepcopy(tiny_lm)
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=config)
    trainer.train()
    n = len(lm_dataset)
    (mask, clusters) = flagged[0]
    assert clusters.shape == (n,)  # flagged per cluster: every cluster gives up its own rounded quarter
    sizes = np.unique(clusters, return_counts=True)[1]
    assert mask.sum() == sum(int(np.floor(0.25 * m + 0.5)) for m in sizes)
    kept = trainer.selection.indices
    assert kept.size == int(np.floor(0.5 * n + 0.5)) and not mask[kept].any()
    report = json.loads((tmp_path / "out" / "selection_report.json").read_text())
    assert report["n_suspected_noise"] == int(mask.sum()) and report["features_from_cache"] is False
    assert "Suspected noise" in (tmp_path / "out" / "README.md").read_text()
    args.output_dir = str(tmp_path / "again")
    again = ClusterTrainer(model=untrained, args=args, train_dataset=lm_dataset, data_collator=collator,
                           cluster_config=config)
    again.train()
    report = json.loads((tmp_path / "again" / "selection_report.json").read_text())
    assert report["features_from_cache"] is True and len(flagged) == 2
    np.testing.assert_array_equal(flagged[1][0], mask)
    np.testing.assert_array_equal(again.selection.indices, kept)


def test_auto_runs_the_filter_for_a_classification_head_and_reads_a_language_model_pool_first(
        tmp_path, tokenizer, _tiny_lm_base, collator):
    """`noise_share="auto"` (the default): for a classification head every cluster defers the estimated noise rate
    (at least 0.2) of its rows, recorded with the estimate and counted in the report; for a language model 0.2 when
    its replies read noisy (`reply_disagreement` >= 0.1), else none, recorded with the share it read."""
    import copy

    import tiny_assets
    from test_near_duplicates import near_copy_dataset, train_on
    from transformers import DataCollatorWithPadding, LlamaForSequenceClassification

    dataset, source = near_copy_dataset(tokenizer)
    lm_trainer, lm_report = train_on(tmp_path / "lm", copy.deepcopy(_tiny_lm_base), dataset, collator)
    lm_params = lm_report["clustering_params"]
    assert lm_params["noise_share"] == 0.2 and "noise_rate_estimate" not in lm_params
    applied = 0.2 if lm_params["reply_disagreement"] >= 0.1 else 0.0
    assert lm_params["noise_share_applied"] == applied
    assert lm_report["n_suspected_noise"] == sum(int(np.floor(round(applied * m, 6) + 0.5))
                                                 for m in lm_report["cluster_sizes"])
    labelled = dataset.remove_columns("labels").add_column("labels", [int(s % 3) for s in source])
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(tiny_assets.llama_config(len(tokenizer), num_labels=3,
                                                                    pad_token_id=tokenizer.pad_token_id))
    trainer, report = train_on(tmp_path / "cls", model, labelled, DataCollatorWithPadding(tokenizer))
    params = report["clustering_params"]
    assert params["noise_share"] == 0.2 and 0.0 <= params["noise_rate_estimate"] <= 1.0
    rate = params["noise_rate_estimate"]
    assert params["noise_share_applied"] == pytest.approx(min(rate, 0.5) if rate >= 0.3 else 0.2, abs=1e-4)
    # every cluster of m rows gives up floor(applied * m + 0.5) of them
    expected = sum(int(np.floor(round(params["noise_share_applied"] * m, 6) + 0.5)) for m in report["cluster_sizes"])
    assert report["n_suspected_noise"] == expected > 0
    assert trainer.selection.indices.size == 36


def _badge_like(n_per_class: int, noisy: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs of 3 classes (near e0, e1, e2) and BADGE-like features `(p - onehot(y)) ⊗ h` with the model leaning to
    the true class (p = 0.6 on it); the first `noisy` rows of every class carry another class's label. Returns
    (inputs [n, 3], features [n, 9], relabelled [n] bool)."""
    rng = np.random.default_rng(seed)
    rows, feats, flipped = [], [], []
    for c in range(3):
        for i in range(n_per_class):
            h = np.eye(3)[c] + 0.05 * rng.standard_normal(3)
            label = (c + 1) % 3 if i < noisy else c
            p = np.full(3, 0.2)
            p[c] = 0.6
            rows.append(h)
            feats.append(np.outer(p - np.eye(3)[label], h).ravel())
            flipped.append(i < noisy)
    return np.array(rows), np.array(feats), np.array(flipped)


@pytest.mark.parametrize("noisy, rate, applied", [(0, 0.0, 0.2), (5, 0.25, 0.2), (6, 0.3, 0.3), (8, 0.4, 0.4)])
def test_the_estimated_noise_rate_is_the_share_of_rows_against_their_neighbours(noisy, rate, applied):
    """A relabelled row's BADGE feature points against its neighbours' (agreement < 0): the estimate is the planted
    rate; `with_noise_filter(estimate="labels")` then flags that share of every cluster when it is at least 0.3 (a pool
    that looks noisy), else the configured 0.2, and records both."""
    from hf_cluster_select.selection.noise_filter import estimated_noise_rate, with_noise_filter
    from hf_cluster_select.settings import SelectionSettings

    inputs, features, flipped = _badge_like(20, noisy)
    agreement = neighbour_agreement(inputs, features, neighbors=19)  # a row's neighbours: the rest of its class
    assert estimated_noise_rate(agreement) == pytest.approx(rate)
    labels = np.repeat(np.arange(3), 20)
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=np.zeros((60, 2)), n_clusters=3,
                              method="fine_kmeans")
    settings = SelectionSettings(noise_share=0.2, noise_neighbors=19)
    out, suspected = with_noise_filter(result, inputs, features, settings, seed=0, estimate="labels")
    assert out.params["noise_rate_estimate"] == pytest.approx(rate)
    assert out.params["noise_share_applied"] == pytest.approx(applied)
    assert out.params["n_suspected_noise"] == suspected.sum() == 3 * round(applied * 20)
    assert suspected[flipped].all() == (applied >= rate)  # every relabelled row is flagged once the share covers it
    fixed, fixed_suspected = with_noise_filter(result, inputs, features, settings, seed=0)
    assert fixed_suspected.sum() == 12 and "noise_rate_estimate" not in fixed.params
    assert estimated_noise_rate(np.array([np.inf, -0.1, 0.3, np.inf])) == 0.5  # rows without an input state are out
    assert estimated_noise_rate(np.full(3, np.inf)) == 0.0
    with pytest.raises(ValueError, match="agreement"):
        estimated_noise_rate(np.zeros((2, 2)))


def _replies_like(n_per_skill: int, swapped: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4 skills: prompts (input states) near e_s, and `hidden_mean`-like reply features that share one large
    component (10 · e_0 of the feature space) plus their skill's direction; the first `swapped` rows of every skill
    carry the next skill's reply. Returns (inputs [n, 4], features [n, 6], swapped [n] bool)."""
    rng = np.random.default_rng(seed)
    inputs, features, flags = [], [], []
    for s in range(4):
        for i in range(n_per_skill):
            reply = (s + 1) % 4 if i < swapped else s
            inputs.append(np.eye(4)[s] + 0.05 * rng.standard_normal(4))
            features.append(10.0 * np.eye(6)[0] + np.eye(6)[reply + 1] + 0.05 * rng.standard_normal(6))
            flags.append(i < swapped)
    return np.array(inputs), np.array(features), np.array(flags)


@pytest.mark.parametrize("swapped, applied", [(0, 0.0), (1, 0.0), (2, 0.2), (4, 0.2)])
def test_a_language_model_pool_is_read_noisy_from_its_centred_reply_features(swapped, applied):
    """Every raw `hidden_mean`-like feature agrees with its neighbours' (the shared component), so the label estimate
    reads 0; centred on the pool's mean, a swapped reply points against its prompt neighbours' replies:
    `reply_disagreement` is the planted share, and `with_noise_filter(estimate="replies")` keeps the configured share
    from `NOISY_REPLY_SHARE` (0.1) on and turns the filter off below it."""
    from hf_cluster_select.selection.noise_filter import (estimated_noise_rate, reply_disagreement,
                                                          with_noise_filter)
    from hf_cluster_select.settings import NOISY_REPLY_SHARE, SelectionSettings

    inputs, features, flags = _replies_like(20, swapped)
    assert estimated_noise_rate(neighbour_agreement(inputs, features, neighbors=19)) == 0.0
    assert reply_disagreement(inputs, features, neighbors=19) == pytest.approx(swapped / 20)
    labels = np.repeat(np.arange(4), 20)
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=np.zeros((80, 2)), n_clusters=4,
                              method="fine_kmeans")
    out, suspected = with_noise_filter(result, inputs, features, SelectionSettings(noise_share=0.2, noise_neighbors=19),
                                       seed=0, estimate="replies")
    assert out.params["reply_disagreement"] == pytest.approx(swapped / 20)
    assert (out.params["noise_share_applied"] >= NOISY_REPLY_SHARE) == (swapped / 20 >= NOISY_REPLY_SHARE)
    assert out.params["noise_share_applied"] == applied and "noise_rate_estimate" not in out.params
    assert out.params["n_suspected_noise"] == suspected.sum() == 4 * round(applied * 20)
    # on: every swapped row is among the deferred; off: nothing is deferred
    assert suspected[flags].all() if applied else not suspected.any()
    rows_without_state = inputs.copy()
    rows_without_state[:2] = 0.0  # no loss-bearing token: left out of the mean and of the estimate
    assert reply_disagreement(rows_without_state[:2], features[:2]) == 0.0
    with pytest.raises(ValueError, match="estimate"):
        with_noise_filter(result, inputs, features, SelectionSettings(), seed=0, estimate="yes")
    with pytest.raises(ValueError, match="features"):
        reply_disagreement(inputs, features[:5])


def test_one_neighbour_search_serves_several_feature_sets():
    """`neighbour_agreements` (what `with_noise_filter` runs for a language model: raw and centred features) gives,
    per set, exactly `neighbour_agreement`'s values, with a sampled reference and rows without an input state."""
    from hf_cluster_select.selection.noise_filter import centred_features, neighbour_agreements

    rng = np.random.default_rng(3)
    inputs, features = rng.standard_normal((60, 5)), rng.standard_normal((60, 7)) + 4.0
    inputs[[4, 9]] = 0.0  # no input state: inf, and left out of the centring mean
    centred = centred_features(inputs, features)
    np.testing.assert_allclose(centred[inputs.any(axis=1)].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_array_equal(centred[[4, 9]], features[[4, 9]])
    both = neighbour_agreements(inputs, [features, centred], neighbors=6, seed=1, reference_rows=25)
    for values, alone in zip(both, (features, centred)):
        np.testing.assert_array_equal(values, neighbour_agreement(inputs, alone, neighbors=6, seed=1,
                                                                  reference_rows=25))
    assert np.isinf(both[0][[4, 9]]).all() and np.isfinite(np.delete(both[0], [4, 9])).all()
    assert (both[0] > 0.5).mean() > 0.9 > (both[1] > 0.5).mean()  # the shared offset agrees; centred, it does not
    with pytest.raises(ValueError, match="features"):
        neighbour_agreements(inputs, [features, features[:5]])


def test_the_estimate_is_capped_at_half_of_every_cluster():
    """`"auto"` never defers more than `MAX_AUTO_SHARE` (half) of a cluster, however noisy the pool looks."""
    from hf_cluster_select.selection.noise_filter import MAX_AUTO_SHARE, with_noise_filter
    from hf_cluster_select.settings import SelectionSettings

    inputs, _, _ = _badge_like(20, 0)
    features = np.repeat(np.eye(3), 20, axis=0) * np.tile([1.0, -1.0], 30)[:, None]  # half of a class against half
    labels = np.repeat(np.arange(3), 20)
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=np.zeros((60, 2)), n_clusters=3,
                              method="fine_kmeans")
    out, suspected = with_noise_filter(result, inputs, features, SelectionSettings(noise_share=0.2, noise_neighbors=19),
                                       seed=0, estimate="labels")
    assert out.params["noise_rate_estimate"] > MAX_AUTO_SHARE == out.params["noise_share_applied"] == 0.5
    assert suspected.sum() == 30


def test_the_recorded_share_is_what_ran():
    """`clustering_params["noise_share"]` is recorded as resolved, and left out for a targeted run (the filter does
    not run on the targeted path, whatever `"auto"` resolved to)."""
    from hf_cluster_select.pipeline import with_resolved_settings

    labels = np.zeros(6, dtype=np.int64)
    result = ClusteringResult(labels=labels, raw_labels=labels, reduced=np.zeros((6, 2)), n_clusters=1,
                              method="fine_kmeans")
    config = ClusterSelectConfig(strategy_kwargs={"noise_share": 0.2})
    assert with_resolved_settings(result, config).params["noise_share"] == 0.2
    assert "noise_share" not in with_resolved_settings(result, config, targeted=True).params


def test_reset_optimizer_state_auto_follows_the_noise_estimate():
    from hf_cluster_select.settings import AllocationSettings, resolve_reset_optimizer_state

    assert AllocationSettings().reset_optimizer_state == "auto"
    assert resolve_reset_optimizer_state("auto", {"noise_rate_estimate": 0.3}) is True
    assert resolve_reset_optimizer_state("auto", {"noise_rate_estimate": 0.29}) is False
    assert resolve_reset_optimizer_state("auto", {}) is False and resolve_reset_optimizer_state("auto", None) is False
    assert resolve_reset_optimizer_state(True, {}) is True
    assert resolve_reset_optimizer_state(False, {"noise_rate_estimate": 0.9}) is False
    with pytest.raises(TypeError, match="reset_optimizer_state"):
        AllocationSettings(reset_optimizer_state="yes")


@pytest.mark.parametrize("rate, restarts", [(0.45, True), (0.1, False)])
def test_the_trainer_clears_adam_on_a_pool_estimated_noisy_and_resumes_so(tmp_path, tokenizer, monkeypatch, rate,
                                                                          restarts):
    """The default `reset_optimizer_state="auto"` with the default noise filter on a classification head: Adam's
    step count restarts at the first subset step when the estimated noise rate is >= 0.3 and counts on below it; a
    run resumed at that step (the checkpoint holds the warm-up's Adam state) decides the same from the saved report
    and ends with the same weights."""
    import tiny_assets
    from test_near_duplicates import near_copy_dataset
    from test_trainer import AdamSteps
    from transformers import DataCollatorWithPadding, LlamaForSequenceClassification, TrainingArguments

    from hf_cluster_select import ClusterTrainer
    from hf_cluster_select.selection import noise_filter

    monkeypatch.setattr(noise_filter, "estimated_noise_rate", lambda agreement: rate)
    dataset, source = near_copy_dataset(tokenizer)
    labelled = dataset.remove_columns("labels").add_column("labels", [int(s % 3) for s in source])

    def run(name, save, resume=None):
        torch.manual_seed(0)
        model = LlamaForSequenceClassification(tiny_assets.llama_config(len(tokenizer), num_labels=3,
                                                                        pad_token_id=tokenizer.pad_token_id))
        args = TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=4, num_train_epochs=1,
                                 learning_rate=1e-3, warmup_steps=2, save_strategy=save, save_steps=2, report_to=[],
                                 use_cpu=True, seed=0, disable_tqdm=True)
        trainer = ClusterTrainer(model=model, args=args, train_dataset=labelled,
                                 data_collator=DataCollatorWithPadding(tokenizer),
                                 cluster_config=ClusterSelectConfig(data_fraction=0.5))
        steps = AdamSteps()
        trainer.add_callback(steps)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, steps.steps

    trainer, steps = run("full", "steps")
    warmup = trainer.step_plan.warmup_steps
    assert warmup == 2 and trainer.selection_report.clustering_params["noise_rate_estimate"] == rate
    total = len(steps)
    assert steps == (list(range(1, warmup + 1)) + list(range(1, total - warmup + 1)) if restarts
                     else list(range(1, total + 1)))
    resumed, _ = run("resumed", "no", resume=str(tmp_path / "full" / f"checkpoint-{warmup}"))
    for p, q in zip(trainer.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
