"""The `hf-cluster-select` command: `select` on a tiny model and a JSONL file, `report`, `--help`."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hf_cluster_select import ClusterSelectConfig
from hf_cluster_select.commands import build_parser, config_from_args, format_report, main


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tokenizer, _tiny_lm_base):
    folder = tmp_path_factory.mktemp("tiny_model")
    _tiny_lm_base.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


CHAT_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def chat_model_folder(tmp_path_factory, model_folder):
    """The tiny model with a chat template, for the --messages-column cases."""
    from transformers import AutoTokenizer

    folder = str(tmp_path_factory.mktemp("chat_model"))
    shutil.copytree(model_folder, folder, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    import tiny_assets

    texts = tiny_assets.make_texts(40, seed=3)
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    with open(path, "w") as handle:
        for i, text in enumerate(texts):
            words = text.split()
            handle.write(json.dumps({"q": " ".join(words[:3]), "a": " ".join(words[3:]), "id": i}) + "\n")
    return str(path)


def test_select_writes_dataset_report_and_a_reusable_selection(tmp_path, model_folder, data_file):
    import datasets

    out = str(tmp_path / "sel")
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--selection-seed", "3", "--output", out]) == 0
    table = datasets.load_from_disk(os.path.join(out, "dataset"))
    assert table.column_names == ["q", "a", "id", "cluster_id", "raw_cluster_id", "weight", "kept"]
    assert sum(table["kept"]) == 10 and table["id"] == list(range(40))
    weights = np.asarray(table["weight"])
    assert np.all((weights > 0) == np.asarray(table["kept"])) and weights.sum() == pytest.approx(40)
    parquet = datasets.load_dataset("parquet", data_files=os.path.join(out, "selection.parquet"), split="train")
    assert parquet["cluster_id"] == table["cluster_id"]
    report = json.load(open(os.path.join(out, "selection_report.json")))
    assert report["n_kept"] == 10 and report["config"]["selection_seed"] == 3 and report["features_seconds"] > 0
    clusters = json.load(open(os.path.join(out, "clusters.json")))
    assert sum(c["size"] for c in clusters) == 40 and sum(c["kept"] for c in clusters) == 10
    assert all(len(c["examples"]) <= 3 for c in clusters) and clusters[0]["examples"][0]
    for name in ("cluster_selection.npz", "README.md", "cluster_sizes.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    text = format_report(out)
    assert format_report(os.path.join(out, "selection_report.json")) == text  # the report file itself works too
    assert text.startswith("kept 10 of 40 examples (25.0%)") and text.count("\n| ") == len(clusters) + 1
    # prompt / completion rows give their replies, so the near-duplicate check runs by default; no row merges here
    assert report["n_near_duplicate_rows"] == 0 and report["clustering_params"]["near_duplicate_threshold"] == 0.7
    assert "near duplicates: 0 examples joined an earlier example's group (token check, " in text
    assert report["token_kind"] == "loss" and 0 < report["tokens_kept"] < report["tokens_total"]
    assert (f"\nkept {report['tokens_kept']} of {report['tokens_total']} loss-bearing tokens "
            f"({report['tokens_kept'] / report['tokens_total']:.1%})\n") in text
    assert "input tokens" not in text  # an example budget: no token-budget line
    # the same command again: the features come from the cache, the selection is identical
    again = str(tmp_path / "again")
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--selection-seed", "3", "--output", again]) == 0
    second = json.load(open(os.path.join(again, "selection_report.json")))
    assert report["features_from_cache"] is False and second["features_from_cache"] is True
    assert second["kept_indices"] == report["kept_indices"] and second["weights"] == report["weights"]
    from hf_cluster_select.persistence import load_selection

    first_loss, second_loss = load_selection(out).difficulty, load_selection(again).difficulty  # for easy_to_hard
    assert first_loss.shape == (10,) and np.isfinite(first_loss).all() and (first_loss > 0).all()
    np.testing.assert_array_equal(second_loss, first_loss)  # the cached features' losses


def test_every_config_field_is_an_option_and_none_parses():
    parser = build_parser()
    args = parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o", "--pca-dim", "None",
                              "--data-fraction", "0.4", "--balance-tokens", "false", "--within-cluster", "random"])
    config = config_from_args(args)
    assert config.cluster_settings.pca_dim is None and config.data_fraction == 0.4
    assert config.allocation_settings.balance_tokens is False and config.strategy_kwargs == {
        "balance_tokens": False, "pca_dim": None}  # only the settings given
    assert config.within_cluster == "random" and config.feature == ClusterSelectConfig().feature
    help_text = parser._subparsers._group_actions[0].choices["select"].format_help()
    for name in ("data-fraction", "cluster-sample-size", "feature-layers", "within-cluster", "stratify-column",
                 "hdbscan-min-samples", "kmeans-size-cap", "strategy-kwargs"):
        assert f"--{name}" in help_text
    hdbscan = config_from_args(parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o",
                                                  "--cluster-method", "hdbscan", "--hdbscan-min-samples", "3"]))
    assert hdbscan.cluster_settings.hdbscan_min_samples == 3
    with pytest.raises(ValueError, match="a setting of cluster_method='hdbscan'"):  # not the chosen clusterer's
        config_from_args(parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o",
                                            "--hdbscan-min-samples", "3"]))
    as_json = config_from_args(parser.parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o",
                                                  "--strategy-kwargs", '{"pca_dim": 32}', "--kept-per-cluster", "8"]))
    assert as_json.strategy_kwargs == {"kept_per_cluster": 8, "pca_dim": 32}  # JSON and options together
    base = ["select", "--model", "m", "--dataset", "d", "--output", "o", "--strategy-kwargs", '{"pca_dim": 32}']
    with pytest.raises(ValueError, match=r"`pca_dim` is given twice: 16 by `--pca-dim` and 32 in `--strategy-kwargs`"):
        config_from_args(parser.parse_args(base + ["--pca-dim", "16"]))  # neither wins silently
    assert config_from_args(parser.parse_args(base + ["--pca-dim", "32"])).strategy_kwargs == {"pca_dim": 32}
    json_only = ["select", "--model", "m", "--dataset", "d", "--output", "o", "--strategy-kwargs"]
    for given, option, message in ((8.0, "8", "`strategy_kwargs`: `pca_dim` must be an int"),  # checked, not ==
                                   (True, "1", "`strategy_kwargs`: `pca_dim` must be an int"),
                                   ("4", None, "`strategy_kwargs`: `pca_dim` must be an int")):
        extra = [] if option is None else ["--pca-dim", option]
        with pytest.raises(ValueError, match=message):  # blamed on what the user typed: the JSON, not --pca-dim
            config_from_args(parser.parse_args(json_only + [json.dumps({"pca_dim": given})] + extra))
    with pytest.raises(ValueError, match="`--pca-dim` must be an int >= 1 or None, got 'eight'"):
        config_from_args(parser.parse_args(json_only + ['{"pca_dim": 8}', "--pca-dim", "eight"]))
    same = config_from_args(parser.parse_args(json_only + ['{"near_duplicate_threshold": 1}',
                                                           "--near-duplicate-threshold", "1.0"]))
    assert same.selection_settings.near_duplicate_threshold == 1.0  # 1 and 1.0 mean the same value
    with pytest.raises(ValueError, match=r"^the options have settings that none of the chosen strategies takes: "
                                         r"`--drop-hardest` \(a setting of within_cluster='drop_hard_random'"):
        config_from_args(parser.parse_args(json_only[:-1] + ["--drop-hardest", "0.4"]))  # named as typed
    with pytest.raises(ValueError, match=r"^`strategy_kwargs` has settings .*: 'drop_hardest'"):
        config_from_args(parser.parse_args(json_only + ['{"drop_hardest": 0.4}']))


def test_bad_columns_paths_and_values_are_one_line_errors(tmp_path, model_folder, data_file, capsys):
    base = ["select", "--model", model_folder, "--dataset", data_file, "--output", str(tmp_path / "x")]
    assert main(base) == 2
    assert "hf-cluster-select select: error:" in capsys.readouterr().err
    assert main(base + ["--text-column", "nope"]) == 2
    assert "`--text-column` 'nope' not a column of the dataset (columns: ['q', 'a', 'id'])" in capsys.readouterr().err
    assert main(["select", "--model", model_folder, "--dataset", str(tmp_path / "no.jsonl"), "--text-column", "a",
                 "--output", str(tmp_path / "x")]) == 2
    assert "no.jsonl' does not exist" in capsys.readouterr().err
    for option, value, expected in (("--data-fraction", "abc", "`--data-fraction`"), ("--data-fraction", "0",
                                    "`--data-fraction` must be in (0, 1], got 0.0"), ("--feature-cache", "maybe",
                                    "`--feature-cache` must be true, false (also yes/no, 1/0), got")):
        assert main(base + ["--text-column", "a", option, value]) == 2  # the config's message, one line
        err = capsys.readouterr().err
        assert err.startswith("hf-cluster-select select: error:") and expected in err and err.count("\n") == 1
    for option, value in (("--max-length", "ten"), ("--order", "random"), ("--frobnicate", "3")):  # argparse's
        with pytest.raises(SystemExit, match="2"):
            main(base + ["--text-column", "a", option, value])
        err = capsys.readouterr().err
        assert err.startswith("hf-cluster-select") and ": error: " in err and err.count("\n") == 1, err
        assert "lists the options" in err and (option in err or value in err), err
    with pytest.raises(ValueError, match="holds no selection_report.json"):
        format_report(str(tmp_path))
    with pytest.raises(ValueError, match="nothere' does not exist"):
        format_report(str(tmp_path / "nothere"))
    assert main(["report", str(tmp_path)]) == 2  # the command: one line, no traceback
    assert "hf-cluster-select report: error:" in capsys.readouterr().err


def test_option_values_parse_like_hf_argument_parser():
    parser = build_parser()
    base = ["select", "--model", "m", "--dataset", "d", "--output", "o"]
    for text, expected in (("yes", True), ("1", True), ("True", True), ("no", False), ("0", False)):
        assert config_from_args(parser.parse_args(base + ["--feature-cache", text])).feature_cache is expected
    assert config_from_args(parser.parse_args(base + ["--stratify-column", "2024"])).stratify_column == "2024"


def test_an_unwritable_cache_costs_the_cache_not_the_selection(tmp_path, model_folder, data_file, monkeypatch,
                                                              caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HF_CLUSTER_SELECT_CACHE", str(blocker / "cache"))
    out = tmp_path / "sel"
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--output", str(out)]) == 0
    assert "could not store the features in the cache" in caplog.text  # a logged warning (stderr without logging set up)
    assert json.load(open(out / "selection_report.json"))["n_kept"] == 10


@pytest.mark.parametrize("module", ["hf_cluster_select.cli", "hf_cluster_select"])
def test_help_from_the_module(module):
    out = subprocess.run([sys.executable, "-m", module, "select", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--data-fraction" in out.stdout and "--kept-per-cluster" in out.stdout


def test_report_states_the_token_budget_under_budget_unit_tokens(tmp_path):
    from hf_cluster_select.reporting.outputs import REPORT_FILENAME

    report = dict(n_kept=30, n_examples=100, fraction_kept=0.3, n_clusters=4, clustering_method="fine_kmeans",
                  n_noise=0, features_seconds=1.0, clustering_seconds=0.5, token_kind="loss", tokens_kept=900,
                  tokens_total=2000, input_tokens_kept=3100, input_tokens_total=10000,
                  config=dict(budget_unit="tokens", data_fraction=0.3))
    (tmp_path / REPORT_FILENAME).write_text(json.dumps(report))
    lines = format_report(str(tmp_path)).splitlines()
    assert lines[1:3] == ["kept 900 of 2000 loss-bearing tokens (45.0%)",
                          "kept 3100 of 10000 input tokens (31.0%): what budget_unit='tokens' counts"]


def test_report_into_a_closed_pipe_ends_quietly(tmp_path):
    """`hf-cluster-select report FOLDER | head -1`: no BrokenPipeError traceback when the reader leaves early."""
    import subprocess
    import sys

    from hf_cluster_select.reporting.outputs import REPORT_FILENAME

    report = dict(n_kept=1, n_examples=2, fraction_kept=0.5, n_clusters=1, clustering_method="fine_kmeans", n_noise=0)
    (tmp_path / REPORT_FILENAME).write_text(json.dumps(report))
    rows = [dict(cluster=i, size=2, kept=1, weight=2.0, mean_tokens=3.0, mean_loss=None, examples=["x" * 100])
            for i in range(3000)]  # about 0.5 MB of table: more than a pipe holds
    (tmp_path / "clusters.json").write_text(json.dumps(rows))
    command = (f"{sys.executable} -c 'from hf_cluster_select.commands import main; "
               f"raise SystemExit(main([\"report\", \"{tmp_path}\"]))' | head -1")
    completed = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False)
    assert completed.stdout.startswith("kept 1 of 2 examples (50.0%)")
    assert "Traceback" not in completed.stderr and "BrokenPipeError" not in completed.stderr


def _bad_inputs(tmp: "os.PathLike", model_folder: str, data_file: str, chat: str) -> dict[str, tuple[list[str], str]]:
    """Case → (the options that differ from a good `select` call, a part of its one-line error)."""
    import datasets

    tmp = str(tmp)

    def write(name: str, text: str) -> str:
        with open(os.path.join(tmp, name), "w") as handle:
            handle.write(text)
        return os.path.join(tmp, name)

    def folder(name: str, **files: str) -> str:
        os.makedirs(os.path.join(tmp, name))
        for file, text in files.items():
            write(os.path.join(name, file), text)
        return os.path.join(tmp, name)

    config_json = open(os.path.join(model_folder, "config.json")).read()
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"q": ["a"], "a": ["b"]})}).save_to_disk(
        os.path.join(tmp, "dict"))
    return {
        "dataset missing": (["--dataset", os.path.join(tmp, "no.jsonl")], "no.jsonl' does not exist"),
        "folder not a dataset": (["--dataset", folder("notes", **{"a.txt": "x"})],
                                 "cannot be read as a folder saved with `datasets.save_to_disk` (FileNotFoundError"),
        "unknown extension": (["--dataset", write("data.txt", "q a")], "must be a ['.csv', '.json', '.jsonl'"),
        "empty file": (["--dataset", write("empty.jsonl", "")], "empty.jsonl' is an empty file"),
        "corrupt jsonl": (["--dataset", write("bad.jsonl", '{"q": "a", "a": "b"}\n{"q": \n')],
                          "bad.jsonl' cannot be read as json data (ArrowInvalid"),
        "corrupt json": (["--dataset", write("bad.json", '[{"q": "a"')], "bad.json' cannot be read as json data"),
        "unreadable csv": (["--dataset", write("bad.csv", '"q,a\n1,"2\n"')], "bad.csv' cannot be read as csv data"),
        "unreadable parquet": (["--dataset", write("bad.parquet", "not parquet")],
                               "bad.parquet' cannot be read as parquet data (ArrowInvalid"),
        "zero rows": (["--dataset", write("header.csv", "q,a\n")], "header.csv' holds no rows"),
        "split missing": (["--dataset", os.path.join(tmp, "dict")], "`--split train` is not in"),
        "split of a file": (["--split", "test"], "`--split test` is not in"),
        "model not a folder": (["--model", data_file], "`--model` must be a model folder"),
        "model missing": (["--model", os.path.join(tmp, "nothere")], "nothere' does not exist: give a local folder saved"),
        "model without config.json": (["--model", folder("empty_model")], "has no config.json"),
        "model without tokenizer": (["--model", folder("no_tokenizer", **{"config.json": config_json})],
                                    "has no tokenizer (none of tokenizer.json"),
        "tokenizer that does not load": (["--model", folder("bad_tokenizer", **{"config.json": config_json,
                                                                                "tokenizer.json": "{",
                                                                                "model.safetensors": ""})],
                                         "its tokenizer does not load"),
        "output a file": (["--output", write("out.txt", "")], "out.txt' is a file, not a folder"),
        "output not writable": (["--output", os.path.join(write("blocker", ""), "sel")], "cannot be written ("),
        "output not empty": (["--output", folder("used", **{"README.md": "mine"})],
                             "is not empty: pass `--overwrite`"),
        "output is the model": (["--output", model_folder, "--overwrite"], "is or holds an input of the command"),
        "max length 0": (["--max-length", "0"], "`--max-length` must be >= 1, got 0"),
        "batch size 0": (["--batch-size", "0"], "`--batch-size` must be >= 1, got 0"),
        "seed below 0": (["--selection-seed", "-1"], "`--selection-seed` must be in [0, 2**32 - 1], got -1"),
        "stratify column missing": (["--stratify-column", "topic"], "`--stratify-column` 'topic' is not a column"),
        "loss column missing": (["--prompt-column", "question"], "`--prompt-column` 'question' not a column of the dataset (columns: ['q', 'a', 'id'])"),
        "null completion": (["--dataset", write("null.jsonl", '{"q": "a", "a": "b"}\n{"q": "c", "a": null}\n')],
                            "`--completion-column` 'a' must hold text, got NoneType None in row 1"),
        "numeric prompt": (["--dataset", write("number.jsonl", '{"q": 3, "a": "b"}\n')],
                           "`--prompt-column` 'q' must hold text, got int 3 in row 0"),
        "output column taken": (["--dataset", write("taken.jsonl", '{"q": "a", "a": "b", "kept": true}\n')],
                                "taken.jsonl' already has the column(s) ['kept'] that `select` writes"),
        "not a causal LM": (["--model", folder("classifier", **{
            "config.json": json.dumps({**json.loads(config_json), "architectures": ["BertForSequenceClassification"]}),
            "tokenizer.json": open(os.path.join(model_folder, "tokenizer.json")).read(), "model.safetensors": ""})],
            "is a BertForSequenceClassification, not a causal language model"),
        "model without weights": (["--model", folder("no_weights", **{
            "config.json": config_json, "tokenizer.json": open(os.path.join(model_folder, "tokenizer.json")).read()})],
            "no_weights' has no weights (no *.safetensors or pytorch_model*.bin)"),
        "output holds the dataset": (["--dataset", os.path.join(folder("parent", **{"data.jsonl": '{"q": "a", "a": "b"}'}),
                                                                "data.jsonl"), "--output",
                                      os.path.join(tmp, "parent"), "--overwrite"], "is or holds an input of the command"),
        "null stratum": (["--stratify-column", "g", "--dataset", write("strata.jsonl", '{"q": "a", "a": "b", "g": "x"}\n'
                                                                     '{"q": "c", "a": "d", "g": null}\n')],
                         "`--stratify-column` 'g' has no value in row 1"),
        "null in the target": (["--target", write("target.jsonl", '{"q": "a", "a": "b"}\n{"q": "c", "a": null}\n')],
                               "`--completion-column` 'a' must hold text, got NoneType None in row 1 of `--target`"),
        "no chat template": (["--messages-column", "m", "--model", model_folder, "--dataset", write(
            "chat.jsonl", json.dumps({"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}))],
                             "`--messages-column` needs a tokenizer with a chat template"),
        "null last message": (["--messages-column", "m", "--model", chat, "--dataset", write("null_message.jsonl", json.dumps(
            {"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]}) + "\n")],
            "`--messages-column` 'm' must hold a non-empty list of messages, each a dict with text \"content\", the "
            "last the reply (not a user or system turn), got [{'role': 'user', 'content': 'a'}, {'role': "
            "'assistant', 'content': None}] in row 0"),
        "no messages": (["--messages-column", "m", "--model", chat, "--dataset", write("no_messages.jsonl", '{"m": []}\n')],
                        "must hold a non-empty list of messages, each a dict with text \"content\", the last the "
                        "reply (not a user or system turn), got [] in row 0"),
        "null first message": (["--messages-column", "m", "--model", chat, "--dataset", write("null_first.jsonl", json.dumps(
            {"m": [{"role": "user", "content": None}, {"role": "assistant", "content": "b"}]}) + "\n")],
            "got [{'role': 'user', 'content': None}, {'role': 'assistant', 'content': 'b'}] in row 0"),
        "last message a user turn": (["--messages-column", "m", "--model", chat, "--dataset", write("user_last.jsonl", json.dumps(
            {"m": [{"role": "user", "content": "a"}]}) + "\n")], "the last the reply (not a user or system turn)"),
    }


BAD_CASES = ["dataset missing", "folder not a dataset", "unknown extension", "empty file", "corrupt jsonl",
             "corrupt json", "unreadable csv", "unreadable parquet", "zero rows", "split missing", "split of a file",
             "model not a folder", "model without config.json", "model without tokenizer",
             "tokenizer that does not load", "output a file", "output not writable", "output not empty",
             "output is the model", "max length 0", "batch size 0", "seed below 0", "stratify column missing",
             "loss column missing", "model missing", "null completion", "numeric prompt", "output column taken",
             "not a causal LM", "null last message", "no messages", "model without weights",
             "output holds the dataset", "null stratum", "null in the target", "null first message",
             "last message a user turn", "no chat template"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_input_is_one_line_and_exit_2_before_the_model_loads(case, tmp_path, model_folder, data_file,
                                                                    chat_model_folder, monkeypatch, capsys):
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    changes, expected = _bad_inputs(tmp_path, model_folder, data_file, chat_model_folder)[case]
    capsys.readouterr()  # what building the inputs printed
    options = {"--model": model_folder, "--dataset": data_file, "--prompt-column": "q", "--completion-column": "a",
               "--output": str(tmp_path / "sel")}
    flags = [c for c in changes if c == "--overwrite"]
    changes = [c for c in changes if c != "--overwrite"]
    options.update(zip(changes[::2], changes[1::2]))
    if "--messages-column" in options:
        del options["--prompt-column"], options["--completion-column"]
    argv = ["select", *[part for pair in options.items() for part in pair], *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-cluster-select select: error: ") and err.count("\n") == 1, err
    assert expected in err and "--debug" not in err, err


def test_config_refuses_a_seed_numpy_and_scikit_learn_cannot_take():
    assert ClusterSelectConfig(selection_seed=2**32 - 1).selection_seed == 2**32 - 1
    for seed in (-1, 2**32):
        with pytest.raises(ValueError, match=rf"`selection_seed` must be in \[0, 2\*\*32 - 1\], got {seed}"):
            ClusterSelectConfig(selection_seed=seed)


def test_stratify_column_keeps_shares_and_overwrite_writes_into_a_used_folder(tmp_path, model_folder, data_file):
    import datasets

    rows = [dict(json.loads(line), group="rare" if i < 12 else "common") for i, line in enumerate(open(data_file))]
    path = tmp_path / "grouped.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "sel"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["select", "--model", model_folder, "--dataset", str(path), "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--stratify-column", "group",
                 "--output", str(out), "--overwrite"]) == 0
    saved = np.load(out / "cluster_selection.npz", allow_pickle=False)
    kept = [rows[i]["group"] for i in saved["indices"]]
    assert kept.count("rare") == 3 and kept.count("common") == 7  # 12 and 28 rows, a quarter of each
    assert json.loads(str(saved["meta"]))["config"]["stratify_column"] == "group"
    table = datasets.load_from_disk(str(out / "dataset"))
    assert np.flatnonzero(table["kept"]).tolist() == sorted(saved["indices"].tolist())
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite: written into, nothing else removed


def test_an_unexpected_error_is_one_line_with_a_debug_hint(tmp_path, model_folder, data_file, monkeypatch, capsys):
    from hf_cluster_select import pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(pipeline, "select_with_model", broken)
    argv = ["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q", "--completion-column",
            "a", "--output", str(tmp_path / "sel")]
    assert main(argv) == 2
    err = capsys.readouterr().err  # after the model's loading bar: the one line
    assert err.endswith("\nhf-cluster-select select: error: RuntimeError: something broke (rerun with --debug for the "
                        "traceback)\n")
    with pytest.raises(RuntimeError, match="something broke"):
        main(argv + ["--debug"])


def test_select_reports_the_copies_the_near_duplicate_check_joined(tmp_path, model_folder, data_file, capsys):
    """40 distinct rows plus exact copies of rows 0-4: the token check puts the 5 copies into their source's
    group, and the summary JSON, the report file and `report` all say 5."""
    rows = [json.loads(line) for line in open(data_file)]
    path = tmp_path / "copies.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows + rows[:5]))
    out = str(tmp_path / "sel")
    assert main(["select", "--model", model_folder, "--dataset", str(path), "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--near-duplicate-threshold", "0.7",
                 "--output", out]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])
    assert summary["n_near_duplicate_rows"] == 5 and summary["n_kept"] == 11
    stage = next(line for line in printed.splitlines() if line.startswith("[3/4]"))
    assert "; 5 near-duplicate examples joined an earlier one, check " in stage  # the check's own seconds
    assert json.load(open(os.path.join(out, "selection_report.json")))["n_near_duplicate_rows"] == 5
    assert ("near duplicates: 5 examples joined an earlier example's group (token check, "
            "near_duplicate_threshold=0.7, duplicate_weight='group', ") in format_report(out)


def test_top_level_help_names_every_command_and_no_internal_layer():
    text = build_parser().format_help()
    assert "`select`, `report`, `demo` and `cache`." in text and "layer" not in text
    assert "{select,report,demo,cache}" in text


def test_auto_is_accepted_in_any_case_by_every_option_that_takes_it():
    args = build_parser().parse_args([
        "select", "--model", "m", "--dataset", "d", "--output", "o", "--duplicate-weight", "AUTO",
        "--feature-precision", "Auto", "--feature", "AUTO", "--near-duplicate-threshold", "AUTO",
        "--balance-tokens", "AUTO", "--quota", "uniform", "--reset-optimizer-state", "Auto",
    ])
    config = config_from_args(args)
    assert (config.feature, config.selection_settings.duplicate_weight, config.feature_settings.feature_precision,
            config.selection_settings.near_duplicate_threshold, config.allocation_settings.balance_tokens,
            config.selection_settings.quota, config.allocation_settings.reset_optimizer_state) == (
        "auto", "auto", "auto", "auto", "auto", "uniform", "auto")
    off = config_from_args(build_parser().parse_args([
        "select", "--model", "m", "--dataset", "d", "--output", "o", "--reset-optimizer-state", "off"]))
    assert off.allocation_settings.reset_optimizer_state is False
    with pytest.raises(ValueError, match=r"--reset-optimizer-state` must be true, false \(also yes/no, 1/0\) or auto, "
                                         r"got .maybe."):
        config_from_args(build_parser().parse_args([
            "select", "--model", "m", "--dataset", "d", "--output", "o", "--reset-optimizer-state", "maybe"]))
    with pytest.raises(SystemExit):  # other text still meets the choices check
        build_parser().parse_args(["select", "--model", "m", "--dataset", "d", "--output", "o", "--quota", "UNIFORM"])


def test_a_dataset_tokenized_as_docs_cli_says_trains_on_the_selection(tmp_path, model_folder, data_file):
    """docs/cli.md's recipe for the training data of `ClusterTrainer(selection="selection/")`: prompt and completion
    without special tokens, EOS after the completion, labels −100 on the prompt, exactly the three columns. It is
    accepted and trains on the kept rows; the same data with one more column is refused as other training data."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from hf_cluster_select import ClusterTrainer
    from hf_cluster_select.collate import pad_collate

    out = str(tmp_path / "sel")
    assert main(["select", "--model", model_folder, "--dataset", data_file, "--prompt-column", "q",
                 "--completion-column", "a", "--data-fraction", "0.25", "--output", out]) == 0
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    rows = [json.loads(line) for line in open(data_file)]
    examples = []
    for row in rows:
        prompt = tokenizer(row["q"], add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["a"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append({"input_ids": prompt + answer, "attention_mask": [1] * (len(prompt) + len(answer)),
                         "labels": [-100] * len(prompt) + answer})
    dataset = datasets.Dataset.from_list(examples)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = functools.partial(pad_collate, pad_token_id=pad)

    def trainer(data, name):
        args = TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=4, num_train_epochs=1,
                                 report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
        return ClusterTrainer(model=AutoModelForCausalLM.from_pretrained(model_folder), args=args, train_dataset=data,
                              data_collator=collator, selection=out)

    run = trainer(dataset, "ok")
    run.train()
    assert run.selection.indices.tolist() == json.load(open(os.path.join(out, "selection_report.json")))["kept_indices"]
    with pytest.raises(ValueError, match="different training data"):
        trainer(dataset.add_column("id", list(range(len(rows)))), "extra").train()


def test_messages_column_puts_the_loss_on_the_last_reply_only(model_folder):
    """`--messages-column`: the chat template renders every message but the last as the prompt (labels −100), the
    last message's content plus EOS carries the loss."""
    import argparse

    import datasets
    from transformers import AutoTokenizer

    from hf_cluster_select.select_inputs import tokenize

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    rows = datasets.Dataset.from_list([{"m": [{"role": "user", "content": "the cat"},
                                              {"role": "assistant", "content": "sat down"}]}])
    args = argparse.Namespace(text_column=None, prompt_column=None, completion_column=None, messages_column="m",
                              max_length=64)
    examples, texts = tokenize(rows, tokenizer, args)
    prompt = tokenizer("[user] the cat ", add_special_tokens=False)["input_ids"]
    answer = tokenizer("sat down", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert examples[0]["input_ids"] == prompt + answer
    assert examples[0]["labels"] == [-100] * len(prompt) + answer
    assert texts == ["[user] the cat  sat down"]
