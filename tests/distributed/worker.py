"""torchrun worker for the multi-process tests: trains tiny ClusterTrainer runs and writes what every rank saw.

    python -m torch.distributed.run --nproc_per_node=2 --master_port PORT tests/distributed/worker.py OUT main,resume

Scenarios (run in the order given, in one process group, so the start-up cost is paid once):
- `main`: warm-up 1 step, then 3 epochs over a 45-of-90 subset (7 steps; gradient accumulation 4 over 6 batches per
  rank: the last step of each epoch has 2 micro-batches); checkpoint at step 4; token metrics logged every step.
- `resume`: resumes `main` from its checkpoint-4 (mid-way through the 2nd subset epoch); selection must not run.
- `main3`: like `main` without checkpoint, sized for 3 processes (54 of 90 kept, accumulation 2).
- `select0`: selection before training (warm-up 0) with the noise filter (`noise_share=0.2`), 36 of 90 kept (the last micro-step holds 4 examples for 8
  slots), token metrics averaged over 2-step logging intervals.
- `paper`: CluSTER's allocation (`ClusterSelectConfig.paper`, proportional quota) on 65 examples with uneven
  styles; one cluster per rank, per-rank loss weight K·|C_k|/N; checkpoint at step 3.
- `paper_resume`: resumes `paper` from its checkpoint-3; selection (made before training) must not run again.
- `sharded`: the `fine_kmeans` setting `sharded=True` (`selection/sharded.py`), warm-up 1 step, 36 of 90 kept.
- `curriculum`: `order="easy_to_hard"` with fixed batches (`balance_tokens=False`): warm-up 1 step, 36 of 90 kept,
  2 epochs of 5 micro-steps, each running up the kept examples' feature-pass loss.

Each rank writes `OUT/<scenario>/rank<r>.json` (trained micro-batches, loader lengths, selection, plan, logs) and
`OUT/<scenario>/params_rank<r>.pt` (final weights). `build_trainer` is also imported by the tests to make the same
run in one process.
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/ (tiny_assets)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository (hf_cluster_select)

import tiny_assets  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from hf_cluster_select import ClusterSelectConfig, ClusterTrainer  # noqa: E402
from hf_cluster_select.features import FEATURES  # noqa: E402
from hf_cluster_select.data import INDEX_KEY  # noqa: E402

FEATURE_CALLS: list[list[int]] = []  # the dataset indices this process computed features for, per call
GATHERED: list[dict] = []  # every distributed.gather_rows call: its dst, the rows sent and the shape received


def _recording(signal):
    """`signal`, recording the dataset indices it computes features for (its `input_states` mark kept: `wraps`)."""
    @functools.wraps(signal)
    def features(model, dataset, indices, *args, **kwargs):
        FEATURE_CALLS.append([int(i) for i in indices])
        return signal(model, dataset, indices, *args, **kwargs)

    return features

SCENARIOS = {
    "main": dict(
        n=90,
        config=dict(data_fraction=0.5, selection_warmup_steps=1),
        args=dict(gradient_accumulation_steps=4, num_train_epochs=3, save_strategy="steps", save_steps=4),
    ),
    "main3": dict(  # for 3 processes: 54 kept, 5 batches per rank (60 slots), accumulation 2 (steps of 2, 2, 1)
        n=90,
        config=dict(data_fraction=0.6, selection_warmup_steps=1),
        args=dict(gradient_accumulation_steps=2, num_train_epochs=2),
    ),
    "select0": dict(
        n=90,
        config=dict(data_fraction=0.4, selection_warmup_steps=0, noise_share=0.2),
        args=dict(num_train_epochs=1, logging_steps=2),
    ),
    "paper": dict(
        n=65,
        paper=True,
        config=dict(data_fraction=0.5, quota="proportional"),
        args=dict(num_train_epochs=1, save_strategy="steps", save_steps=3),
    ),
}
SCENARIOS["target"] = dict(  # targeted selection: 6 rows of the pool as a 2-task target set
    n=90,
    config=dict(data_fraction=0.4, selection_warmup_steps=0, strategy_kwargs={"target_column": "task"}),
    args=dict(num_train_epochs=1),
    target=True,
)
SCENARIOS["curriculum"] = dict(
    n=90,
    config=dict(data_fraction=0.4, selection_warmup_steps=1, order="easy_to_hard",
                strategy_kwargs={"balance_tokens": False}),
    args=dict(num_train_epochs=2),
)
SCENARIOS["sharded"] = dict(  # select_sharded: no rank gathers feature rows
    n=90,
    config=dict(data_fraction=0.4, selection_warmup_steps=1, strategy_kwargs={"sharded": True}),
    args=dict(num_train_epochs=1),
)
SCENARIOS["resume"] = SCENARIOS["main"]
SCENARIOS["select0_again"] = SCENARIOS["select0"]  # the same run again: features from the cache on every rank
CACHE_OF = {"select0_again": "select0"}  # scenario -> the scenario whose feature cache it shares (else its own)
SCENARIOS["paper_resume"] = SCENARIOS["paper"]
RESUME_FROM = {"resume": ("main", 4), "paper_resume": ("paper", 3)}  # scenario -> (run, checkpoint step)


class RecordingTrainer(ClusterTrainer):
    """Records every micro-batch that reaches `compute_loss` in training: step, logical epoch, example ids, padded
    tokens and the loss weights applied."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[dict] = []
        self.logical_epoch = -1

    def _run_epoch(self, model, epoch, *args, **kwargs):
        self.logical_epoch = epoch
        return super()._run_epoch(model, epoch, *args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            index = inputs[INDEX_KEY].cpu()
            dense = self.selection_run.dense_loss_weights
            weights = None if dense is None else dense[index].tolist()
            self.seen.append(
                dict(step=self.state.global_step, epoch=self.logical_epoch, ids=index.tolist(),
                     tokens=int(inputs["input_ids"].numel()), weights=weights)
            )
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


def uneven_indices(n: int) -> list[int]:
    """`n` indices of a 90-example dataset, all of one style first: 45 even (style A), then odd (style B)."""
    return list(range(0, 90, 2)) + list(range(1, 90, 2))[: n - 45]


def build_trainer(scenario: str, out_dir: str, cls=RecordingTrainer) -> ClusterTrainer:
    """The tiny model, data and trainer of `scenario` (same in every process and in the pytest process)."""
    spec = SCENARIOS[scenario]
    tokenizer = tiny_assets.build_tokenizer()
    dataset = tiny_assets.build_dataset(tokenizer, n=90)
    if spec["n"] != 90:
        dataset = dataset.select(uneven_indices(spec["n"]))
    values = dict(
        output_dir=os.path.join(out_dir, "out"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_find_unused_parameters=False,
        seed=0,
        disable_tqdm=True,
    )
    values.update(spec["args"])
    make = ClusterSelectConfig.paper if spec.get("paper") else tiny_assets.config_with
    target = dataset.select(range(6)).add_column("task", ["a"] * 3 + ["b"] * 3) if spec.get("target") else None
    return cls(
        target_dataset=target,
        model=tiny_assets.build_model(tokenizer),
        args=TrainingArguments(**values),
        train_dataset=dataset,
        data_collator=tiny_assets.build_collator(tokenizer),
        cluster_config=make(**spec["config"]),
    )


def _iterate(trainer: RecordingTrainer, loader, sampler, epoch: int) -> list[list[int]]:
    """Every batch a prepared loader yields on this rank for `epoch` (ids)."""
    sampler.set_epoch(epoch)
    loader.set_epoch(epoch)
    return [batch[INDEX_KEY].tolist() for batch in loader]


def run(scenario: str, out: str) -> None:
    folder = os.path.join(out, scenario)
    os.makedirs(folder, exist_ok=True)
    os.environ["HF_CLUSTER_SELECT_CACHE"] = os.path.join(out, "feature-cache", CACHE_OF.get(scenario, scenario))
    trainer = build_trainer(scenario, folder)
    FEATURE_CALLS.clear()
    GATHERED.clear()
    if scenario in RESUME_FROM:
        def no_selection(*args, **kwargs):
            raise AssertionError("selection ran again on resume")

        trainer.run_selection = no_selection
        run_name, step = RESUME_FROM[scenario]
        trainer.train(resume_from_checkpoint=os.path.join(out, run_name, "out", f"checkpoint-{step}"))
    else:
        trainer.train()
    plan = trainer.step_plan
    rank = trainer.args.process_index
    record = dict(
        rank=rank,
        world_size=trainer.args.world_size,
        global_step=trainer.state.global_step,
        max_steps=trainer.state.max_steps,
        plan=plan.to_dict(),
        seen=trainer.seen,
        feature_indices=FEATURE_CALLS,
        gathered=GATHERED,
        features_from_cache=trainer.selection_report.features_from_cache,
        target=trainer.selection_report.target,
        batch_order=trainer.selection_report.batch_order,
        selection=dict(
            indices=trainer.selection.indices.tolist(),
            weights=trainer.selection.weights.tolist(),
            labels=trainer.selection.labels.tolist(),
            all_labels=trainer.selection_run.labels.tolist(),
            raw_labels=trainer.selection_run.raw_labels.tolist(),
            difficulty=None if trainer.selection_run.difficulty is None else trainer.selection_run.difficulty.tolist(),
        ),
        logs=[{k: v for k, v in entry.items() if k.startswith("cluster_select/") or k in ("step", "loss")}
              for entry in trainer.state.log_history],
    )
    if scenario not in RESUME_FROM:
        subset = {}
        for epoch in range(plan.warmup_epochs, plan.num_epochs):
            subset[epoch] = _iterate(trainer, trainer._cs_subset_loader, trainer.selection_run.subset_sampler, epoch)
        record["subset_loader_len"] = len(trainer._cs_subset_loader)
        record["subset_batches"] = subset
        if plan.warmup_steps:
            loader = trainer.get_train_dataloader()
            record["warmup_batches"] = _iterate(trainer, loader, trainer.selection_run.warmup_sampler, 0)
            record["warmup_loader_len"] = len(loader)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    params = {name: p.detach().cpu().clone() for name, p in trainer.model.named_parameters()}
    torch.save(params, os.path.join(folder, f"params_rank{rank}.pt"))


def _recording_gather(gather):
    """`distributed.gather_rows`, recording what this rank sent and what it received (`None`: nothing)."""
    def gather_rows(local_rows, local_indices, n_examples, dst=None):
        received = gather(local_rows, local_indices, n_examples, dst=dst)
        GATHERED.append(dict(dst=dst, sent=list(local_rows.shape),
                             received=None if received is None else list(received.shape)))
        return received

    return gather_rows


def main(argv: list[str]) -> None:
    out, scenarios = argv[0], argv[1].split(",")
    from hf_cluster_select import distributed

    distributed.gather_rows = _recording_gather(distributed.gather_rows)
    for name in FEATURES.names():  # only in the worker process, never under pytest
        FEATURES._entries[name] = _recording(FEATURES.get(name))
    for scenario in scenarios:
        run(scenario, out)


if __name__ == "__main__":
    main(sys.argv[1:])
