"""A saved selection (`cluster_selection.npz`) is checked before anything trains on it (issue 20):
`saved_selection.validate_saved_selection` on load, and again against the dataset in `SelectionRun.check_saved`.
Each case tampers a real file and asserts the field the error names; nothing trains on a tampered file."""

from __future__ import annotations

import copy
import json
import os
import shutil

import numpy as np
import pytest
import tiny_assets
import torch
from transformers import TrainingArguments

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer, Selection, SelectionRun
from hf_cluster_select.integrations.feature_model import load_given_selection
from hf_cluster_select.persistence import SELECTION_FILENAME, SavedSelection, load_selection

CONFIG = ClusterSelectConfig(data_fraction=0.5, selection_warmup_steps=0)


def _args(output_dir):
    return TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, num_train_epochs=1,
                             save_strategy="steps", save_steps=6, report_to=[], use_cpu=True, disable_tqdm=True,
                             warmup_steps=0, seed=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _tiny_lm_base, lm_dataset, collator):
    """A real run (96 examples, 48 kept, 12 steps): `output_dir` with its selection and checkpoints 6 and 12."""
    output_dir = tmp_path_factory.mktemp("trained") / "out"
    with pytest.MonkeyPatch.context() as patch:  # a cache of its own: the autouse private cache comes after this
        patch.setenv("HF_CLUSTER_SELECT_CACHE", str(tmp_path_factory.mktemp("feature-cache")))
        ClusterTrainer(model=copy.deepcopy(_tiny_lm_base), args=_args(output_dir), train_dataset=lm_dataset,
                       data_collator=collator, cluster_config=CONFIG).train()
    assert (output_dir / "checkpoint-12" / SELECTION_FILENAME).is_file()
    return output_dir


@pytest.fixture
def folder(tmp_path, trained):
    """A copy of the run's `output_dir`, free to tamper with."""
    return shutil.copytree(trained, tmp_path / "out")


def _arrays(folder):
    with np.load(os.path.join(folder, SELECTION_FILENAME)) as data:
        return {name: data[name].copy() for name in data.files}


def _rewrite(folder, **changes):
    """Rewrite `folder/cluster_selection.npz` with arrays replaced (`None` drops one); `meta` changes are a dict
    merged into the saved one (a `None` value drops that key). Returns the file's path."""
    arrays = _arrays(folder)
    meta = json.loads(str(arrays["meta"]))
    meta.update(changes.pop("meta", {}))
    arrays["meta"] = np.array(json.dumps({k: v for k, v in meta.items() if v is not None}))
    arrays.update(changes)
    path = os.path.join(folder, SELECTION_FILENAME)
    with open(path, "wb") as handle:
        np.savez(handle, **{k: v for k, v in arrays.items() if v is not None})
    return path


def _with(array, position, value):
    array = array.copy()
    array[position] = value
    return array


def test_the_saved_selection_is_valid(trained):
    saved = load_selection(str(trained))
    assert saved.selection.n_kept == 48 and saved.selection.n_total == 96 and saved.path.endswith(SELECTION_FILENAME)
    assert saved.difficulty.shape == (48,) and np.isfinite(saved.difficulty).all()  # kept losses (nats), any order


def _weights_times_three(a):
    return {"weights": a["weights"] * 3}


def _move_last_index_past_the_data(a):
    return {"indices": _with(a["indices"], -1, 96)}


def _first_index_negative(a):
    return {"indices": _with(a["indices"], 0, -1)}


def _repeat_an_index(a):
    return {"indices": _with(a["indices"], 5, a["indices"][4])}


def _swap_two_indices(a):
    return {"indices": _with(_with(a["indices"], 5, a["indices"][6]), 6, a["indices"][5])}


CASES = {  # case: (tamper, the error after "<path>: ")
    "nan weight": (lambda a: {"weights": _with(a["weights"], 3, np.nan)},
                   "`weights` must be finite and > 0; 1 is NaN (position 3)."),
    "negative weight": (lambda a: {"weights": _with(a["weights"], 3, -50.0)},
                        "`weights` must be finite and > 0; 1 is <= 0 (position 3: -50.0)."),
    "zero weights": (lambda a: {"weights": _with(_with(a["weights"], 0, 0.0), 7, 0.0)},
                     "`weights` must be finite and > 0; 2 are <= 0 (first at position 0: 0.0)."),
    "inf weight": (lambda a: {"weights": _with(a["weights"], 2, np.inf)},
                   "`weights` must be finite and > 0; 1 is infinite (position 2: inf)."),
    "weights x3": (_weights_times_three, "`weights` must sum to n_total = 96 (the examples the kept set stands for) "
                                         "within a relative 1e-6; found 288."),
    "index past the data": (_move_last_index_past_the_data,
                            "`indices` must be in [0, n_total = 96); 1 is outside (position 47: 96)."),
    "negative index": (_first_index_negative, "`indices` must be in [0, n_total = 96); 1 is outside (position 0: -1)."),
    "duplicate index": (_repeat_an_index, "`indices` must be unique; 1 is a repeat (position 5: {i4})."),
    "unsorted indices": (_swap_two_indices, "`indices` must be sorted ascending; 1 is below the one before "
                                            "(position 6: {i5})."),
    "float indices": (lambda a: {"indices": a["indices"].astype(np.float64)},
                      "`indices` must hold integers; found dtype float64."),
    "labels too short": (lambda a: {"labels": a["labels"][:-1]}, "`labels` must hold n_total = 96 entries; found 95."),
    "raw labels too long": (lambda a: {"raw_labels": np.r_[a["raw_labels"], 0]},
                            "`raw_labels` must hold n_total = 96 entries; found 97."),
    "kept labels too short": (lambda a: {"kept_labels": a["kept_labels"][:-1]},
                              "`kept_labels` must hold n_kept = 48 entries; found 47."),
    "negative kept label": (lambda a: {"kept_labels": _with(a["kept_labels"], 1, -1)},
                            "`kept_labels` must be clusters >= 0; 1 is negative (position 1: -1)."),
    "weights missing": (lambda a: {"weights": None}, "`weights` is missing."),
    "difficulty too short": (lambda a: {"difficulty": a["difficulty"][:-1]},
                             "`difficulty` must hold n_kept = 48 entries; found 47."),
    "integer difficulty": (lambda a: {"difficulty": a["difficulty"].astype(np.int64)},
                           "`difficulty` must hold floats; found dtype int64."),
    "n_total 0": (lambda a: {"meta": {"n_total": 0}}, "`n_total` must be an int >= 1; found 0."),
    "n_total not labels' length": (lambda a: {"meta": {"n_total": 97}, "weights": a["weights"] * 97 / 96},
                                   "`labels` must hold n_total = 97 entries; found 96."),
    "config missing": (lambda a: {"meta": {"config": None}}, "`config` is missing."),
    "config unknown key": (lambda a: {"meta": {"config": dict(CONFIG.to_dict(), foo=1)}},
                           "`config` must be a valid ClusterSelectConfig; `values` has keys that are not "
                           "ClusterSelectConfig fields: ['foo']."),
    "config bad value": (lambda a: {"meta": {"config": dict(CONFIG.to_dict(), data_fraction=2)}},
                         "`config` must be a valid ClusterSelectConfig; `data_fraction` must be in (0, 1], got 2.0."),
    "fingerprint missing": (lambda a: {"meta": {"fingerprint": None}}, "`fingerprint` is missing."),
    "fingerprint empty": (lambda a: {"meta": {"fingerprint": ""}}, "`fingerprint` must be a non-empty str; found ''."),
    "extra not a dict": (lambda a: {"meta": {"extra": [1]}}, "`extra` must be a dict; found list."),
    "clustering_params not a dict": (lambda a: {"meta": {"extra": _with_params(a, ["x"])}},
                                     "`extra.report.clustering_params` must be a dict; found list."),
    "recorded threshold bad": (lambda a: {"meta": {"extra": _with_params(a, {"near_duplicate_threshold": "banana"})}},
                               "`extra.report.clustering_params` must record valid near-duplicate and noise settings; "
                               "`near_duplicate_threshold` must be a float in (0, 1], None or 'auto', got 'banana'."),
    "recorded weight auto": (lambda a: {"meta": {"extra": _with_params(a, {"duplicate_weight": "auto"})}},
                             "`extra.report.clustering_params` must record the near-duplicate and noise settings as "
                             "resolved, not 'auto'."),
}


def _with_params(arrays, params):
    """The saved `extra` with its report's `clustering_params` replaced (a dict is merged into the saved one)."""
    extra = json.loads(str(arrays["meta"]))["extra"]
    saved = extra["report"]["clustering_params"]
    extra["report"]["clustering_params"] = {**saved, **params} if isinstance(params, dict) else params
    return extra


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_selection_is_refused_by_field(folder, case):
    tamper, expected = CASES[case]
    arrays = _arrays(folder)
    path = _rewrite(folder, **tamper(arrays))
    with pytest.raises(ValueError) as info:
        load_selection(str(folder))
    indices = arrays["indices"]
    assert str(info.value) == f"{path}: " + expected.format(i4=indices[4], i5=indices[5])


@pytest.mark.parametrize("content, reason", [
    (b"", "empty file (0 bytes)"),
    (b"hello world", "not an .npz (zip) archive; it starts with b'hell'"),
    (None, "truncated or damaged .npz archive (File is not a zip file)"),
])
def test_an_unreadable_file_is_one_line(folder, content, reason):
    path = os.path.join(folder, SELECTION_FILENAME)
    with open(path, "rb") as handle:
        whole = handle.read()
    with open(path, "wb") as handle:
        handle.write(whole[: len(whole) // 2] if content is None else content)
    with pytest.raises(ValueError) as info:
        load_selection(str(folder))
    assert str(info.value) == f"{path} is not a readable selection file: {reason}"


def test_check_saved_refuses_an_in_memory_selection_before_adopting_it():
    """A `SavedSelection` built in memory (no file) goes through the same checks, and the run's data size."""
    run = SelectionRun(CONFIG, tiny_assets.run_facts(), lengths=[4] * 40, world_size=1, per_device_batch_size=2,
                       gradient_accumulation_steps=1, num_train_epochs=1)
    def saved(weights, n_total=40):
        selection = Selection(indices=np.arange(0, 40, 2), weights=weights, labels=np.zeros(20, dtype=np.int64),
                              n_total=n_total)
        return SavedSelection(selection, np.zeros(n_total, dtype=np.int64), np.zeros(n_total, dtype=np.int64),
                              CONFIG.to_dict(), run.fingerprint, {})

    nan = saved(_with(np.full(20, 2.0), 3, np.nan))
    message = "the given selection (SavedSelection): `weights` must be finite and > 0; 1 is NaN (position 3)."
    for check in (run.adopt_saved, load_given_selection):  # `ClusterTrainer(selection=SavedSelection(...))`
        with pytest.raises(ValueError) as info:
            check(nan)
        assert str(info.value) == message
    with pytest.raises(ValueError, match=r"^the given selection \(SavedSelection\): `n_total` is 50, but the "
                                         r"training data has 40 examples: the selection was made on other"):
        run.adopt_given(saved(np.full(20, 2.5), n_total=50))
    assert run.selection is None and run.dense_loss_weights is None
    run.adopt_saved(saved(np.full(20, 2.0)))
    assert run.selection is not None


def test_cluster_trainer_refuses_a_tampered_selection_before_any_step(tmp_path, trained, folder, tiny_lm, lm_dataset,
                                                                       collator):
    """`ClusterTrainer(selection=...)`: a NaN weight is refused when the file is loaded (no trainer exists); a file
    consistent in itself but made for 97 examples is refused by `train()` before the first step."""
    args = _args(tmp_path / "b")
    path = _rewrite(folder, weights=_with(_arrays(folder)["weights"], 3, np.nan))
    with pytest.raises(ValueError) as info:
        ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator, selection=folder)
    assert str(info.value) == f"{path}: `weights` must be finite and > 0; 1 is NaN (position 3)."

    shutil.copy(trained / SELECTION_FILENAME, path)  # the untampered file again
    arrays = _arrays(folder)
    weights = arrays["weights"] * 97 / 96
    path = _rewrite(folder, weights=weights, labels=np.r_[arrays["labels"], 0],
                    raw_labels=np.r_[arrays["raw_labels"], 0], meta={"n_total": 97})
    before = {name: p.detach().clone() for name, p in tiny_lm.named_parameters()}
    trainer = ClusterTrainer(model=tiny_lm, args=args, train_dataset=lm_dataset, data_collator=collator,
                             selection=folder)
    with pytest.raises(ValueError) as info:
        trainer.train()
    assert str(info.value).startswith(f"{path}: `n_total` is 97, but the training data has 96 examples")
    assert trainer.state.global_step == 0 and trainer.selection is None
    assert all(torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())


def test_resume_refuses_a_tampered_checkpoint_before_loading_it(folder, tiny_lm, lm_dataset, collator):
    """`train(resume_from_checkpoint=...)` (a path, or `True` = the newest checkpoint) names the checkpoint's file
    and field before the Trainer loads its weights; a readable but tampered checkpoint is refused, never skipped."""
    checkpoint = os.path.join(folder, "checkpoint-12")
    path = _rewrite(checkpoint, weights=_with(_arrays(checkpoint)["weights"], 0, -50.0))
    before = {name: p.detach().clone() for name, p in tiny_lm.named_parameters()}
    trainer = ClusterTrainer(model=tiny_lm, args=_args(folder), train_dataset=lm_dataset, data_collator=collator,
                             cluster_config=CONFIG)
    for resume in (checkpoint, True):
        with pytest.raises(ValueError) as info:
            trainer.train(resume_from_checkpoint=resume)
        assert str(info.value) == f"{path}: `weights` must be finite and > 0; 1 is <= 0 (position 0: -50.0)."
        assert trainer.state.global_step == 0 and trainer.selection is None
    assert all(torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())
