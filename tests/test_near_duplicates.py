"""Token near-duplicate groups (selection/near_duplicates.py), their settings, and their use by ClusterTrainer."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select._types import ClusteringResult
from hf_cluster_select.persistence import config_differences
from hf_cluster_select.selection.near_duplicates import (lsh_bands, minhash_signatures, near_duplicate_groups,
                                                         union_groups)

BASE = list(range(100, 140))  # 40 distinct tokens: 38 distinct 3-grams
ONE_CHANGED = BASE[:20] + [999] + BASE[21:]  # shares 35 of the 41 3-grams of the pair: Jaccard 35/41 = 0.854
UNRELATED = list(range(200, 240))
OTHER = list(range(300, 340))


def as_lists(groups):
    return [part.tolist() for part in groups]


def test_exact_and_one_token_copies_join_the_first_row_and_unrelated_rows_stay_apart():
    rows = [UNRELATED, BASE, OTHER, ONE_CHANGED, BASE]
    inverse, first, counts = near_duplicate_groups(rows, 0.7)
    assert as_lists((inverse, first, counts)) == [[0, 1, 2, 1, 1], [0, 1, 2], [1, 3, 1]]
    assert all(part.dtype == np.int64 for part in (inverse, first, counts))
    # at threshold 1.0 only the exact copy: the changed row agrees on fewer than all 64 values
    assert as_lists(near_duplicate_groups(rows, 1.0)) == [[0, 1, 2, 3, 1], [0, 1, 2, 3], [1, 2, 1, 1]]


def test_the_estimate_is_the_share_of_agreeing_minhash_values():
    signatures = minhash_signatures([BASE, ONE_CHANGED, UNRELATED])
    assert signatures.shape == (3, 64) and signatures.dtype == np.uint32
    agree = (signatures[0] == signatures[1]).mean()
    assert abs(agree - 35 / 41) <= 3 * np.sqrt(35 / 41 * 6 / 41 / 64)  # within 3 standard deviations
    assert (signatures[0] == signatures[2]).sum() == 0  # no shared 3-gram


def test_short_and_empty_rows_are_one_shingle_each():
    """A row shorter than the shingle is one shingle, its whole sequence: [5] matches [5] only, [5, 6] differs
    from the 3-gram [5, 6, 7], and the two empty rows are copies of each other."""
    rows = [[5], [5], [5, 6], [], [], [5, 6, 7]]
    assert as_lists(near_duplicate_groups(rows, 1.0)) == [[0, 0, 1, 2, 2, 3], [0, 2, 3, 5], [2, 1, 2, 1]]
    assert as_lists(near_duplicate_groups([[1, 2]], 0.5)) == [[0], [0], [1]]


def test_empty_input_and_inputs_of_other_types():
    assert as_lists(near_duplicate_groups([], 0.7)) == [[], [], []]
    import torch

    rows = [np.array(UNRELATED), torch.tensor(BASE), np.array(ONE_CHANGED, dtype=np.int32)]
    assert as_lists(near_duplicate_groups(rows, 0.7)) == [[0, 1, 1], [0, 1], [1, 2]]


def test_groups_are_deterministic_and_the_same_for_another_seed_on_clear_cases():
    rows = [UNRELATED, BASE, OTHER, ONE_CHANGED, BASE]
    once = as_lists(near_duplicate_groups(rows, 0.7))
    assert as_lists(near_duplicate_groups(rows, 0.7)) == once == as_lists(near_duplicate_groups(rows, np.float32(0.7)))
    assert as_lists(near_duplicate_groups(rows, 0.7, seed=7)) == once
    assert np.array_equal(minhash_signatures(rows), minhash_signatures(rows))
    assert not np.array_equal(minhash_signatures(rows), minhash_signatures(rows, seed=7))


def _changed_copies(source: np.ndarray, count: int) -> list:
    """`count` copies of `source`, copy i with token i % len(source) replaced by the new token 20,000 + i."""
    copies = []
    for i in range(count):
        row = source.copy()
        row[i % source.size] = 20_000 + i
        copies.append(row)
    return copies


def test_a_pile_of_copies_is_one_group_whatever_the_bucket_size():
    """30 copies of one row, each with another token changed, split around 250 unrelated rows: one group of 30, led by
    the first copy (each bucket links its members to its first and next row, not every pair)."""
    rng = np.random.default_rng(0)
    copies = _changed_copies(rng.integers(0, 10_000, 60), 30)
    rows = copies[:15] + [rng.integers(30_000, 60_000, 60) for _ in range(250)] + copies[15:]
    inverse, first, counts = near_duplicate_groups(rows, 0.7)
    assert first.tolist() == [0, *range(15, 265)] and counts.tolist() == [30] + [1] * 250
    assert (inverse[:15] == 0).all() and (inverse[265:] == 0).all()
    assert inverse[15:265].tolist() == list(range(1, 251))


def test_a_pile_of_more_than_32_copies_is_taken_for_template():
    """The documented price of the template rule: a row's shingles found in more than 32 rows count as template. 40
    exact and 40 one-token-changed copies of one row among 300 unrelated rows (21% of the rows, under half): the
    exact copies still join the source (a row of template shingles only keeps them all), a changed copy keeps only its
    few changed shingles and stays apart; with 10 of each (20 rows) every copy joins."""
    rng = np.random.default_rng(1)
    source = rng.integers(0, 10_000, 60)
    unrelated = [rng.integers(30_000, 60_000, 60) for _ in range(300)]
    inverse, first, counts = near_duplicate_groups([source] * 40 + _changed_copies(source, 40) + unrelated, 0.7)
    assert (inverse[:40] == 0).all() and counts[0] == 40 and counts.tolist()[1:] == [1] * 340
    inverse, first, counts = near_duplicate_groups([source] * 10 + _changed_copies(source, 10) + unrelated, 0.7)
    assert (inverse[:20] == 0).all() and counts.tolist() == [20] + [1] * 300


def test_pairs_are_verified_by_their_exact_jaccard():
    """ONE_CHANGED shares 35 of the pair's 41 distinct 3-grams with BASE: Jaccard 0.8537, joined at 0.85 and apart at
    0.86 on every seed (the MinHash estimate only proposes the pair)."""
    rows = [BASE, UNRELATED, ONE_CHANGED]
    for seed in range(5):
        assert near_duplicate_groups(rows, 0.85, seed=seed)[0].tolist() == [0, 1, 0]
        assert near_duplicate_groups(rows, 0.86, seed=seed)[0].tolist() == [0, 1, 2]


def test_a_chain_of_near_copies_is_not_one_group():
    """BASE, a copy with token 10 changed and a copy of that copy with token 30 changed too: each step is at Jaccard
    0.85, the two ends at 32/44 = 0.73. At 0.8 the first copy joins BASE, the second is not a near copy of BASE (the
    group's leader) and leads its own group; at 0.7 both join BASE."""
    once = BASE[:10] + [999] + BASE[11:]
    twice = once[:30] + [998] + once[31:]
    assert as_lists(near_duplicate_groups([BASE, once, twice], 0.8)) == [[0, 0, 1], [0, 2], [2, 1]]
    assert as_lists(near_duplicate_groups([BASE, once, twice], 0.7)) == [[0, 0, 0], [0], [3]]
    # the leader is the first row of the group: led by `once`, both neighbours join it
    assert as_lists(near_duplicate_groups([once, BASE, twice], 0.8)) == [[0, 0, 0], [0], [3]]


def test_lsh_bands_reach_the_recall_at_the_threshold():
    assert [lsh_bands(t) for t in (0.7, 0.85, 0.9, 1.0, 0.3)] == [(21, 3), (12, 5), (10, 6), (1, 64), (64, 1)]
    for threshold in (0.5, 0.7, 0.8, 0.9, 0.95):
        bands, rows = lsh_bands(threshold)
        assert 1 - (1 - threshold ** rows) ** bands >= 0.999 and bands * rows <= 64
        if rows < 64:  # one more row per band would miss the recall
            more = rows + 1
            assert 1 - (1 - threshold ** more) ** (64 // more) < 0.999


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"`threshold` must be a float in \(0, 1\], got 0"):
        near_duplicate_groups([BASE], 0)
    with pytest.raises(ValueError, match="`shingle` must be an int >= 1, got 0"):
        near_duplicate_groups([BASE], 0.7, shingle=0)
    with pytest.raises(ValueError, match="row 1 has shape"):
        near_duplicate_groups([BASE, [[1, 2], [3, 4]]], 0.7)
    with pytest.raises(ValueError, match="dtype float64"):
        near_duplicate_groups([BASE, [1.5, 2.5]], 0.7)


def test_union_joins_a_row_to_both_of_its_groups():
    assert as_lists(union_groups([0, 0, 1, 2, 3], [0, 1, 1, 2, 2])) == [[0, 0, 0, 1, 1], [0, 3], [3, 2]]
    assert as_lists(union_groups([5, 6, 5, 7], [1, 2, 3, 2])) == [[0, 1, 0, 1], [0, 1], [2, 2]]
    assert as_lists(union_groups(np.zeros(0), np.zeros(0))) == [[], [], []]
    with pytest.raises(ValueError, match="one shape"):
        union_groups([0, 1], [0, 1, 2])


def test_the_pipeline_joins_token_groups_into_the_clustering_result():
    from hf_cluster_select.pipeline import with_near_duplicates

    result = ClusteringResult(labels=np.zeros(6, dtype=np.int64), raw_labels=np.zeros(6, dtype=np.int64),
                              reduced=np.zeros((6, 1)), n_clusters=1, method="kmeans", params={"n_unique": 5},
                              groups=np.array([0, 1, 2, 3, 4, 1]))
    joined = with_near_duplicates(result, np.array([0, 1, 0, 2, 3, 3]))
    assert joined.groups.tolist() == [0, 1, 0, 2, 1, 1]  # 0 ~ 2 and 4 ~ 5 by tokens, 5 ~ 1 by features
    assert joined.params == {"n_unique": 5, "n_near_duplicate_rows": 2}
    assert result.groups.tolist() == [0, 1, 2, 3, 4, 1]  # the input is not changed


def test_merging_over_half_of_the_pool_warns_with_the_setting_to_turn_it_off(caplog):
    """3 of 6 examples merged: no warning; 4 of 6 (the multi-task pool of one-word replies merges 190 of 200): a
    warning naming `near_duplicate_threshold=None`."""
    from hf_cluster_select.pipeline import with_near_duplicates

    result = ClusteringResult(labels=np.zeros(6, dtype=np.int64), raw_labels=np.zeros(6, dtype=np.int64),
                              reduced=np.zeros((6, 1)), n_clusters=1, method="kmeans", params={})
    with caplog.at_level("WARNING", logger="hf_cluster_select.pipeline"):
        assert with_near_duplicates(result, np.array([0, 0, 0, 0, 1, 2])).params["n_near_duplicate_rows"] == 3
        assert "near-duplicate" not in caplog.text
        assert with_near_duplicates(result, np.array([0, 0, 0, 0, 0, 1])).params["n_near_duplicate_rows"] == 4
    assert "merged 4 of 6 examples" in caplog.text and "near_duplicate_threshold=None" in caplog.text


def test_token_rows_reads_datasets_and_lists_of_dicts():
    from datasets import Dataset

    from hf_cluster_select.data import token_rows

    examples = [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}, {"input_ids": [5, 6]}]
    assert token_rows(examples) == [[1, 2, 3], [4], [5, 6]]
    dataset = Dataset.from_list(examples).with_format("torch")
    assert [row.tolist() for row in token_rows(dataset, batch_rows=2)] == [[1, 2, 3], [4], [5, 6]]
    reordered = dataset.select([2, 0])  # an indices mapping over the same table
    assert [row.tolist() for row in token_rows(reordered, batch_rows=1)] == [[5, 6], [1, 2, 3]]


# ---- settings ---------------------------------------------------------------------------------------------------
def test_settings_default_to_auto_and_are_validated_with_their_names():
    settings = ClusterSelectConfig().selection_settings
    assert settings.near_duplicate_threshold == "auto" and settings.duplicate_weight == "auto"
    config = ClusterSelectConfig(strategy_kwargs={"near_duplicate_threshold": 1, "duplicate_weight": "one"})
    assert config.selection_settings.near_duplicate_threshold == 1.0
    assert ClusterSelectConfig.from_json(config.to_json()) == config
    numpy_value = ClusterSelectConfig(strategy_kwargs={"near_duplicate_threshold": np.float32(0.5)})
    assert type(numpy_value.selection_settings.near_duplicate_threshold) is float  # numpy numbers, as other settings
    assert numpy_value.selection_settings.near_duplicate_threshold == 0.5
    for value in (0, 1.5, True, np.bool_(True), "0.7", "AUTO", float("nan")):
        with pytest.raises(ValueError, match=r"`strategy_kwargs`: `near_duplicate_threshold` must be a float in "
                                             r"\(0, 1\], None or 'auto', got "):
            ClusterSelectConfig(strategy_kwargs={"near_duplicate_threshold": value})
    with pytest.raises(ValueError, match=r"`strategy_kwargs`: `duplicate_weight` must be one of \['auto', 'group', "
                                         r"'one'\], got 'all'"):
        ClusterSelectConfig(strategy_kwargs={"duplicate_weight": "all"})


@pytest.mark.parametrize("given, token_level, token_check, replies, expected", [
    ({}, False, True, False, (0.7, "one")),  # a classification head: the measured check
    ({}, True, True, True, (0.7, "one")),  # a language model whose rows say which tokens carry the loss
    ({}, True, True, False, (None, "group")),  # ... and one whose rows do not: rows share long prompts
    ({}, False, False, False, (None, "group")),  # sharded selection / no examples: no token check there
    ({}, True, False, True, (None, "group")),
    ({"near_duplicate_threshold": 0.9}, False, True, False, (0.9, "group")),  # a given threshold keeps the weight
    ({"near_duplicate_threshold": 0.9}, True, True, True, (0.9, "group")),
    ({"near_duplicate_threshold": None}, True, True, True, (None, "group")),
    ({"duplicate_weight": "group"}, False, True, False, (0.7, "group")),
    ({"duplicate_weight": "one"}, True, True, False, (None, "one")),
])
def test_auto_resolves_per_head(given, token_level, token_check, replies, expected):
    from hf_cluster_select.settings import resolve_duplicates

    settings = ClusterSelectConfig(strategy_kwargs=given).selection_settings
    assert resolve_duplicates(settings, token_level=token_level, token_check=token_check, replies=replies) == expected


@pytest.mark.parametrize("head, expected", [
    ("BertForSequenceClassification", (0.7, "one")), ("BertForTokenClassification", (0.7, "one")),
    ("BertForMultipleChoice", (0.7, "one")), ("BertForMaskedLM", (None, "group")),
    ("BertForQuestionAnswering", (None, "group")), ("BertModel", (None, "group")),
])
def test_auto_per_model_class(head, expected):
    """What docs/configuration.md calls a classification head: an output layer that is not a vocabulary projection
    and a head the feature pass recognises."""
    import transformers

    from hf_cluster_select.pipeline import with_auto_resolved

    tiny = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                   vocab_size=50)
    settings = with_auto_resolved(ClusterSelectConfig(), getattr(transformers, head)(tiny), "badge").selection_settings
    assert (settings.near_duplicate_threshold, settings.duplicate_weight) == expected
    assert settings.noise_share == 0.2  # the noise filter: the feature pass then reads the pool (noise_filter.py)
    sharded = ClusterSelectConfig(strategy_kwargs={"sharded": True})
    settings = with_auto_resolved(sharded, getattr(transformers, head)(tiny), "badge").selection_settings
    assert (settings.near_duplicate_threshold, settings.noise_share) == (None, 0.0)


def test_auto_is_no_conflict_for_sharded_selection_but_a_threshold_is():
    assert ClusterSelectConfig(strategy_kwargs={"sharded": True}).sharded_conflicts() == []
    with pytest.raises(ValueError, match=r"does not implement \['near_duplicate_threshold=0.7'\]"):
        ClusterSelectConfig(strategy_kwargs={"sharded": True, "near_duplicate_threshold": 0.7})


def test_command_line_options_set_them(tmp_path, capsys):
    from hf_cluster_select.commands import build_parser, config_from_args, main

    base = ["select", "--model", "m", "--dataset", "d", "--output", str(tmp_path / "o")]
    config = config_from_args(build_parser().parse_args(base + ["--near-duplicate-threshold", "0.8",
                                                                "--duplicate-weight", "one"]))
    assert config.strategy_kwargs == {"duplicate_weight": "one", "near_duplicate_threshold": 0.8}
    assert main(base + ["--near-duplicate-threshold", "1.5"]) == 2
    assert ("`--near-duplicate-threshold` must be a float in (0, 1], None or 'auto', got 1.5"
            in capsys.readouterr().err)
    for text, value in (("auto", "auto"), ("AUTO", "auto"), ("none", None), ("1", 1.0)):
        config = config_from_args(build_parser().parse_args(base + ["--near-duplicate-threshold", text]))
        assert config.selection_settings.near_duplicate_threshold == value
    usage = build_parser()._subparsers._group_actions[0].choices["select"].format_usage()
    assert "--near-duplicate-threshold FLOAT|None|auto" in usage and "--duplicate-weight auto|group|one" in usage


# ---- ClusterTrainer ---------------------------------------------------------------------------------------------
def near_copy_dataset(tokenizer, length: int = 40):
    """40 sources of `length` words (so `length` tokens) and 4 near copies of each of the first 8 (one word
    changed, at 1/5, 2/5, 3/5 or 4/5 of the row), shuffled: 72 examples and the source of every one. A copy's token
    3-gram Jaccard with its source: 0.85 at 40 tokens, 0.93 at 80."""
    from datasets import Dataset
    from tiny_assets import WORDS

    rng = random.Random(0)
    sources = [[rng.choice(WORDS) for _ in range(length)] for _ in range(40)]
    rows = [(words, source) for source, words in enumerate(sources)]
    for source in range(8):
        for position in (length // 5, 2 * length // 5, 3 * length // 5, 4 * length // 5):
            words = list(sources[source])
            words[position] = next(w for w in WORDS if w != words[position])
            rows.append((words, source))
    rng.shuffle(rows)
    ids = tokenizer([" ".join(words) for words, _ in rows])["input_ids"]
    assert {len(i) for i in ids} == {length}
    dataset = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length for _ in ids],
                                 "labels": [[-100, -100] + i[2:] for i in ids]})
    return dataset, np.array([source for _, source in rows])


def train_on(tmp_path, tiny_lm, dataset, collator, **settings):
    from transformers import TrainingArguments

    from hf_cluster_select import ClusterTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, num_train_epochs=1, learning_rate=1e-3, warmup_steps=2,
                             save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=dataset, data_collator=collator,
                             cluster_config=ClusterSelectConfig(data_fraction=0.5, strategy_kwargs=settings))
    trainer.train()
    return trainer, json.loads((tmp_path / "out" / "selection_report.json").read_text())


def test_the_trainer_keeps_one_row_per_near_copy_family(tmp_path, _tiny_lm_base, tokenizer, collator):
    """72 rows from 40 sources (8 of them with 4 near copies): with `near_duplicate_threshold` the 36 kept rows
    come from 36 different sources and the report counts the 32 copies; without it, copies share the budget."""
    dataset, source = near_copy_dataset(tokenizer)
    trainer, report = train_on(tmp_path / "on", copy.deepcopy(_tiny_lm_base), dataset, collator,
                               near_duplicate_threshold=0.7, noise_share=0.0)  # the filter defers whole families
    kept = trainer.selection.indices
    assert kept.size == 36 and np.unique(source[kept]).size == 36  # no two kept rows are near copies
    assert report["n_near_duplicate_rows"] == 32 and report["near_duplicates_seconds"] > 0
    assert report["selection_seconds"] == pytest.approx(
        report["features_seconds"] + report["near_duplicates_seconds"] + report["clustering_seconds"])
    assert sum(report["weights"]) == pytest.approx(72)
    assert "Near-duplicate examples" in (tmp_path / "on" / "out" / "README.md").read_text()
    plain, plain_report = train_on(tmp_path / "off", copy.deepcopy(_tiny_lm_base), dataset, collator,
                                   near_duplicate_threshold=None)
    assert plain_report["n_near_duplicate_rows"] is None and plain_report["near_duplicates_seconds"] is None
    assert plain_report["clustering_params"]["near_duplicate_threshold"] is None
    assert plain_report["clustering_params"]["duplicate_weight"] == "group"
    assert np.unique(source[plain.selection.indices]).size < 36  # the check above can fail


def test_a_language_model_runs_the_check_by_default_where_its_rows_give_their_replies(
        tmp_path, _tiny_lm_base, tokenizer, collator):
    """`"auto"` with a language model: rows with token `labels` (the replies known) get the check at 0.7 with
    `duplicate_weight="one"`: the 32 near copies merged, 36 kept rows from 36 sources; the same rows without a
    `labels` column (the collator makes the labels, every token carries loss) get no check, and copies share the
    budget. (The noise filter, which defers whole families of these random rows, is off.)"""
    from transformers import DataCollatorForLanguageModeling

    dataset, source = near_copy_dataset(tokenizer)
    trainer, report = train_on(tmp_path / "labels", copy.deepcopy(_tiny_lm_base), dataset, collator, noise_share=0.0)
    assert report["clustering_params"]["near_duplicate_threshold"] == 0.7
    assert report["clustering_params"]["duplicate_weight"] == "one"
    assert report["n_near_duplicate_rows"] == 32
    kept = trainer.selection.indices
    assert kept.size == 36 and np.unique(source[kept]).size == 36
    plain = dataset.remove_columns("labels")
    trainer, report = train_on(tmp_path / "plain", copy.deepcopy(_tiny_lm_base), plain,
                               DataCollatorForLanguageModeling(tokenizer, mlm=False), noise_share=0.0)
    assert report["clustering_params"]["near_duplicate_threshold"] is None
    assert report["clustering_params"]["duplicate_weight"] == "group" and report["n_near_duplicate_rows"] is None
    assert np.unique(source[trainer.selection.indices]).size < 36


def test_on_a_pool_without_copies_the_default_check_changes_nothing(tmp_path, _tiny_lm_base, tokenizer, collator):
    """One row of each of the 40 sources: the check runs by default (the rows have token labels) and merges
    nothing, and the kept rows and their weights are exactly those of a run with the check off and `"group"`
    weights."""
    dataset, source = near_copy_dataset(tokenizer)
    sources = dataset.select(sorted(int(np.flatnonzero(source == s)[0]) for s in range(40)))
    auto, report = train_on(tmp_path / "auto", copy.deepcopy(_tiny_lm_base), sources, collator)
    off, off_report = train_on(tmp_path / "off", copy.deepcopy(_tiny_lm_base), sources, collator,
                               near_duplicate_threshold=None, duplicate_weight="group")
    assert report["n_near_duplicate_rows"] == 0 and report["clustering_params"]["near_duplicate_threshold"] == 0.7
    assert auto.selection.indices.tolist() == off.selection.indices.tolist()
    assert np.array_equal(auto.selection.weights, off.selection.weights)


def test_a_language_model_runs_the_check_at_0_85_when_asked(tmp_path, _tiny_lm_base, tokenizer, collator):
    """The documented language-model option, the check at 0.85 with `duplicate_weight="one"`: copies one word in 80
    apart (Jaccard 0.93 with their source, 0.86 with each other) are merged, so the 36 kept rows come from 36 sources;
    copies one word in 40 apart are at 35 / 41 = 0.854 from their source, but their replies (the labels: all but the
    first 2 tokens) at 33 / 39 = 0.846, so the reply test merges none of them."""
    dataset, source = near_copy_dataset(tokenizer, length=80)
    option = {"near_duplicate_threshold": 0.85, "duplicate_weight": "one", "noise_share": 0.0}
    trainer, report = train_on(tmp_path / "long", copy.deepcopy(_tiny_lm_base), dataset, collator, **option)
    assert report["clustering_params"]["near_duplicate_threshold"] == 0.85
    assert report["clustering_params"]["duplicate_weight"] == "one"
    assert report["n_near_duplicate_rows"] == 32
    kept = trainer.selection.indices
    assert kept.size == 36 and np.unique(source[kept]).size == 36
    short, source_short = near_copy_dataset(tokenizer)
    _, report_short = train_on(tmp_path / "short", copy.deepcopy(_tiny_lm_base), short, collator, **option)
    assert report_short["n_near_duplicate_rows"] == 0


def test_a_classification_head_runs_the_check_by_default(tmp_path, tokenizer):
    """`"auto"` with a classification head is the check at 0.7 with `duplicate_weight="one"`: the same kept rows
    and weights as those set explicitly, 36 rows from 36 different sources, 32 near copies counted; with
    `duplicate_weight="group"` the kept copies weigh more (the check above can fail)."""
    import tiny_assets
    from transformers import DataCollatorWithPadding, LlamaForSequenceClassification

    dataset, source = near_copy_dataset(tokenizer)
    dataset = dataset.remove_columns("labels").add_column("labels", [int(s % 3) for s in source])
    collator = DataCollatorWithPadding(tokenizer)

    trainers = {}

    def run(name, **settings):
        torch.manual_seed(0)
        model = LlamaForSequenceClassification(tiny_assets.llama_config(len(tokenizer), num_labels=3,
                                                                        pad_token_id=tokenizer.pad_token_id))
        trainers[name], report = train_on(tmp_path / name, model, dataset, collator, noise_share=0.0, **settings)
        return trainers[name].selection, report

    auto, report = run("auto")
    assert auto.indices.size == 36 and np.unique(source[auto.indices]).size == 36
    assert report["n_near_duplicate_rows"] == 32
    assert report["clustering_params"]["near_duplicate_threshold"] == 0.7  # what "auto" resolved to, recorded
    assert report["clustering_params"]["duplicate_weight"] == "one"
    assert "near_duplicate_threshold=0.7, duplicate_weight='one'" in (tmp_path / "auto" / "out" / "README.md").read_text()
    explicit, _ = run("explicit", near_duplicate_threshold=0.7, duplicate_weight="one")
    auto_trainer, explicit_trainer = trainers["auto"], trainers["explicit"]
    np.testing.assert_array_equal(auto.indices, explicit.indices)
    np.testing.assert_allclose(auto.weights, explicit.weights)
    # a checkpoint of the "auto" run resumes with the values spelt out, and the reverse; other values are refused
    from hf_cluster_select.persistence import load_selection
    auto_trainer.selection_run.save(str(tmp_path / "auto_ckpt"))
    explicit_trainer.selection_run.save(str(tmp_path / "explicit_ckpt"))
    explicit_trainer.selection_run.check_saved(load_selection(str(tmp_path / "auto_ckpt")))
    auto_trainer.selection_run.check_saved(load_selection(str(tmp_path / "explicit_ckpt")))
    grouped, _ = run("group", near_duplicate_threshold=0.7, duplicate_weight="group")
    with pytest.raises(ValueError, match="duplicate_weight: 'one' in the checkpoint, 'group' now"):
        trainers["group"].selection_run.check_saved(load_selection(str(tmp_path / "auto_ckpt")))
    # a selection made for another kind of model ("auto" recorded as None / "group", a language model's) is refused
    # on resume, but `selection=` (check_model=False: another model may train on it) compares the settings as written
    import dataclasses

    saved = load_selection(str(tmp_path / "auto_ckpt"))
    report = dict(saved.extra["report"], clustering_params={**saved.extra["report"]["clustering_params"],
                                                            "near_duplicate_threshold": None, "duplicate_weight": "group"})
    from_a_language_model = dataclasses.replace(saved, extra={**saved.extra, "report": report})
    with pytest.raises(ValueError, match="duplicate_weight: 'group' in the checkpoint, 'one' now"):
        auto_trainer.selection_run.check_saved(from_a_language_model)
    auto_trainer.selection_run.check_saved(from_a_language_model, check_model=False)
    with pytest.raises(ValueError, match="near_duplicate_threshold: 'auto' in the checkpoint, 0.7 now"):
        explicit_trainer.selection_run.check_saved(from_a_language_model, check_model=False)  # as written
    trainers["group"].selection_run.save(str(tmp_path / "group_ckpt"))
    with pytest.raises(ValueError, match="duplicate_weight: 'group' in the checkpoint, 'one' now"):  # auto = "one"
        auto_trainer.selection_run.check_saved(load_selection(str(tmp_path / "group_ckpt")))
    families = np.isin(source[grouped.indices], np.arange(8))  # the 8 sources with 4 near copies each
    assert grouped.weights[families].mean() > 2 * grouped.weights[~families].mean()
    assert auto.weights[families].mean() < 2 * auto.weights[~families].mean()


def test_a_resumed_run_compares_auto_as_what_it_resolved_to():
    """`config_differences` compares the near-duplicate settings resolved: the checkpoint's as its report recorded
    them, the current run's for its own settings and model (`resolve_duplicates`). "auto" and 0.7 / "one" are the
    same for a classification head; a threshold alone means "group" (so it differs from "auto"'s "one"); for a
    language model "auto" is None / "group"; without recorded values (an older checkpoint) they compare as given."""
    from hf_cluster_select.settings import resolve_duplicates

    def given(**settings):
        return ClusterSelectConfig(strategy_kwargs=settings)

    def resolved(config, token_level=False):
        threshold, weight = resolve_duplicates(config.selection_settings, token_level=token_level)
        return {"near_duplicate_threshold": threshold, "duplicate_weight": weight}

    def differences(saved, current, token_level=False, recorded=True):
        return config_differences(saved.to_dict(), current.to_dict(),
                                  saved_resolved=resolved(saved, token_level) if recorded else None,
                                  current_resolved=resolved(current, token_level))

    auto, spelt = given(), given(near_duplicate_threshold=0.7, duplicate_weight="one")
    assert differences(auto, spelt) == [] == differences(spelt, auto) == differences(auto, auto, token_level=True)
    threshold_only = given(near_duplicate_threshold=0.7)  # keeps "group"
    assert differences(auto, threshold_only) == ["duplicate_weight: 'one' in the checkpoint, 'group' now"]
    assert differences(threshold_only, auto) == ["duplicate_weight: 'group' in the checkpoint, 'one' now"]
    assert differences(given(duplicate_weight="group"), auto) == ["duplicate_weight: 'group' in the checkpoint, "
                                                                  "'one' now"]
    assert differences(auto, spelt, token_level=True) == [
        "duplicate_weight: 'group' in the checkpoint, 'one' now",
        "near_duplicate_threshold: None in the checkpoint, 0.7 now"]
    assert differences(auto, auto, recorded=False) == []  # an older checkpoint resumed as it was made
    assert differences(auto, spelt, recorded=False) == ["duplicate_weight: 'auto' in the checkpoint, 'one' now",
                                                        "near_duplicate_threshold: 'auto' in the checkpoint, 0.7 now"]


def _templated_pool(prompt_tokens: int, n_rows: int = 40, body_tokens: int = 20):
    """`n_rows` rows: one shared prompt of `prompt_tokens` tokens, then a distinct body of `body_tokens` tokens."""
    prompt = list(range(5000, 5000 + prompt_tokens))
    return [prompt + list(range(10_000 + 100 * i, 10_000 + 100 * i + body_tokens)) for i in range(n_rows)]


def test_a_shared_prompt_does_not_make_distinct_examples_near_copies():
    """A 300-token prompt before 20-token bodies: the full shingle sets agree at Jaccard 298 / 338 = 0.88 > 0.7, but
    the prompt's shingles are in every row (template) and are left out, so only the bodies are compared."""
    rows = _templated_pool(300)
    inverse, first, counts = near_duplicate_groups(rows, 0.7)
    assert counts.tolist() == [1] * 40
    # a row copied with its last token changed is still a near copy of its row: the 20 content shingles (18 in the
    # body, 2 across the prompt's end) agree on 19 of 21, Jaccard 0.90
    changed = rows[3][:-1] + [1]
    inverse, first, counts = near_duplicate_groups(rows + [changed], 0.7)
    assert inverse[40] == 3 and counts.tolist() == [1, 1, 1, 2] + [1] * 36
    # rows that are nothing but the prompt stay copies of each other
    bare = rows[:30] + [rows[0][:300]] * 3
    assert near_duplicate_groups(bare, 0.7)[2].tolist() == [1] * 30 + [3]


def test_template_shingles_are_those_in_more_than_half_or_more_than_32_of_the_rows():
    """A prompt shared by 21 of 40 rows is template; one shared by 19 of 40 (under half, under 33 rows) is content,
    and then the rows that share it (Jaccard 0.88) are one near-copy group. In a pool of 400 rows, a prompt in 100 of
    them (25%, over 32 rows) is template too: the language-model pool where a check without that rule merged a whole
    task's rows."""
    rows = _templated_pool(300)
    half_over = [row if i < 21 else row[300:] for i, row in enumerate(rows)]
    assert near_duplicate_groups(half_over, 0.7)[2].tolist() == [1] * 40
    half_under = [row if i < 19 else row[300:] for i, row in enumerate(rows)]
    assert near_duplicate_groups(half_under, 0.7)[2].tolist() == [19] + [1] * 21
    pool = _templated_pool(300, n_rows=400)
    quarter = [row if i % 4 == 0 else row[300:] for i, row in enumerate(pool)]
    for threshold in (0.7, 0.85):
        assert near_duplicate_groups(quarter, threshold)[2].tolist() == [1] * 400
    # the price: 20 rows of the 400 (5%) with that prompt stay one group at 0.85 (Jaccard 0.88)
    few = [row if i % 20 == 0 else row[300:] for i, row in enumerate(pool)]
    assert near_duplicate_groups(few, 0.85)[2].tolist() == [20] + [1] * 380


def test_examples_without_input_ids_skip_the_check():
    """The check reads `input_ids`; a dataset without them (features only, another modality) is selected without it
    rather than failing, and the report then says it did not run (`None`)."""
    from datasets import Dataset

    from hf_cluster_select.clock import PhaseClock
    from hf_cluster_select.data import has_token_column
    from hf_cluster_select.pipeline import _token_groups

    config = ClusterSelectConfig(data_fraction=0.5, strategy_kwargs={"near_duplicate_threshold": 0.7})
    assert _token_groups([{"pixel_values": [0.0, 1.0]}] * 3, config, PhaseClock()) is None
    assert _token_groups(Dataset.from_dict({"x": [1, 2, 3]}), config, PhaseClock()) is None
    assert not has_token_column([]) and has_token_column([{"input_ids": [1]}])
    groups = _token_groups([{"input_ids": BASE}, {"input_ids": UNRELATED}, {"input_ids": ONE_CHANGED}], config,
                           PhaseClock())
    assert groups.tolist() == [0, 1, 0]


def test_prompts_each_in_half_the_rows_or_fewer_merge_at_0_7_not_at_0_85():
    """Why a language model's threshold is 0.85, not the classification head's 0.7: two 200-token prompts, each in 20
    of 40 rows (neither over half nor over 32 rows), before 20 distinct tokens: each prompt's rows agree at Jaccard
    198 / 238 = 0.83, one group per prompt at 0.7 and none at 0.85."""
    first, second = _templated_pool(200, n_rows=20), _templated_pool(200, n_rows=20)
    second = [[t + 1000 for t in row[:200]] + [t + 5000 for t in row[200:]] for row in second]
    inverse, first_rows, counts = near_duplicate_groups(first + second, 0.7)
    assert sorted(counts.tolist()) == [20, 20] and inverse[:20].tolist() == [0] * 20
    for seed in range(3):
        assert near_duplicate_groups(first + second, 0.85, seed=seed)[2].tolist() == [1] * 40


def test_rows_that_differ_only_in_template_3grams_are_not_near_copies():
    """Three 40-token instructions, each over the same 50 inputs of 40 tokens, then a 2-token label: each instruction
    and each label is in 50 of 150 rows (template), so the three rows of one input have the same content 3-grams;
    their 3-grams taken whole agree at Jaccard about 0.3, and a pair must reach the threshold on both."""
    rng = np.random.default_rng(3)
    instructions = [rng.integers(0, 30_000, 40).tolist() for _ in range(3)]
    labels = [[rng.integers(30_000, 31_000, 2).tolist() for _ in range(2)] for _ in range(3)]
    inputs = [rng.integers(40_000, 90_000, 40).tolist() for _ in range(50)]
    rows = [instructions[t] + x + labels[t][k % 2] for k, x in enumerate(inputs) for t in range(3)]
    for threshold in (0.7, 0.85):
        assert near_duplicate_groups(rows, threshold)[2].tolist() == [1] * 150


def test_replies_keep_the_rows_of_one_task_apart():
    """The pool of the test below with each row's 20 own tokens split into 10 of input and a 10-token reply: the
    whole rows agree at 0.88 within a task, their replies not at all, so with `reply_rows` nothing merges; a near
    copy (2 input tokens changed, same reply) still joins its source; and where every row of a task has the same
    1-token reply (a class name) the replies do not tell the rows apart, so the task merges as without them."""
    rows, replies = [], []
    for task in range(10):
        instruction = list(range(100_000 * (task + 1), 100_000 * (task + 1) + 300))
        for i in range(20):
            own = list(range(50_000 + 1000 * task + 25 * i, 50_000 + 1000 * task + 25 * i + 20))
            rows.append(instruction + own)
            replies.append(own[10:])
    assert near_duplicate_groups(rows, 0.85)[2].tolist() == [20] * 10
    inverse, first, counts = near_duplicate_groups(rows, 0.85, reply_rows=replies)
    assert counts.tolist() == [1] * 200 and inverse.tolist() == list(range(200))
    copy = list(rows[45])
    copy[305], copy[308] = 7, 8
    inverse, _, counts = near_duplicate_groups(rows + [copy], 0.85, reply_rows=replies + [replies[45]])
    assert inverse[200] == inverse[45] == 45 and counts.size == 200
    one_token = [[task // 20 + 1] for task in range(200)]
    assert near_duplicate_groups(rows, 0.85, reply_rows=one_token)[2].tolist() == [20] * 10
    with pytest.raises(ValueError, match="`reply_rows` must hold one reply per row"):
        near_duplicate_groups(rows, 0.85, reply_rows=replies[:3])


def test_reply_rows_reads_the_loss_bearing_tokens():
    """`data.reply_rows`: a token `labels` column's entries other than -100; TRL's `completion_mask` over
    `input_ids`; `None` for class-id labels, for rows without either column and for rows none of which masks a
    prompt before its reply (plain text: every token carries the loss; padding after it is no prompt)."""
    from datasets import Dataset

    from hf_cluster_select.data import reply_rows

    sft = Dataset.from_dict({"input_ids": [[5, 6, 7, 8], [9, 10]], "labels": [[-100, -100, 7, 8], [-100, 10]]})
    assert [r.tolist() for r in reply_rows(sft)] == [[7, 8], [10]]
    trl = Dataset.from_dict({"input_ids": [[5, 6, 7, 8], [9, 10]], "completion_mask": [[0, 0, 1, 1], [0, 1]]})
    assert [r.tolist() for r in reply_rows(trl)] == [[7, 8], [10]]
    assert [r.tolist() for r in reply_rows([{"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}])] == [[3]]
    assert reply_rows(Dataset.from_dict({"input_ids": [[1, 2]], "labels": [1]})) is None
    assert reply_rows(Dataset.from_dict({"input_ids": [[1, 2]]})) is None
    assert reply_rows(Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9, 0]], "labels": [[5, 6, 7], [8, 9, -100]]})) \
        is None
    assert reply_rows(Dataset.from_dict({"input_ids": [[5, 6]], "completion_mask": [[1, 1]]})) is None
    masked_bos = Dataset.from_dict({"input_ids": [[5, 6, 7]], "labels": [[-100, 6, 7]]})  # position 0 is never scored
    assert reply_rows(masked_bos) is None
    mixed = Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 9, 4]], "labels": [[5, 6, 7], [-100, -100, 4]]})
    assert [r.tolist() for r in reply_rows(mixed)] == [[5, 6, 7], [4]]


def test_why_a_language_model_needs_its_replies_for_the_check():
    """A multi-task SFT pool: 10 tasks of 20 rows, each task's 300-token instruction before 20 tokens of the row's
    own. No instruction is template (20 rows: under 33, under half), so without the replies a task's rows agree at
    Jaccard 298 / 338 = 0.88 and, at 0.85, each task becomes one group of 20: 190 of the 200 rows merged (with them:
    `test_replies_keep_the_rows_of_one_task_apart`)."""
    rows = []
    for task in range(10):
        instruction = list(range(100_000 * (task + 1), 100_000 * (task + 1) + 300))
        rows += [instruction + list(range(50_000 + 1000 * task + 25 * i, 50_000 + 1000 * task + 25 * i + 20))
                 for i in range(20)]
    inverse, first, counts = near_duplicate_groups(rows, 0.85)
    assert counts.tolist() == [20] * 10 and first.tolist() == list(range(0, 200, 20))
