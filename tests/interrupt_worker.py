"""A small ClusterTrainer run for the reliability tests, importable (in-process runs) and runnable as a script.

    python tests/interrupt_worker.py OUTPUT_DIR --pause-at PHASE --marker FILE   # pause for the parent to kill
    python tests/interrupt_worker.py OUTPUT_DIR --offline                        # whole pipeline, no network
    python tests/interrupt_worker.py OUTPUT_DIR --broken-hdbscan                 # hdbscan import fails

With `--pause-at`, the run writes FILE and sleeps when it reaches PHASE, so the parent can kill it there:
`features` (second feature batch), `clustering` (inside `hdbscan.HDBSCAN.fit`), `training` (after optimizer step
11, checkpoint-10 saved), `selection_save` (checkpoint-6's selection written to its temporary file, not renamed).
Everything is deterministic (seed 0, one thread), so an in-process run with the same arguments is the reference.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

SAVE_STEPS = 2
TRAIN_PAUSE_STEP = 11
SAVE_PAUSE_CHECKPOINT = "checkpoint-6"


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/ (tiny_assets), also as a script
from tiny_assets import build_dataset, build_model, build_tokenizer  # noqa: E402


def build_trainer(output_dir: str, config=None, eval_dataset=False, **arg_overrides):
    """The tiny run: 96 examples, keep 48, batch 4, 3 warm-up steps + 2 epochs of 12 = 27 steps, a checkpoint
    every 2 steps. Records `(global_step, example indices)` of every trained micro-batch in `trainer.seen`."""
    from transformers import DataCollatorForSeq2Seq, TrainingArguments

    from hf_cluster_select import ClusterTrainer
    from tiny_assets import hdbscan_config
    from hf_cluster_select.data import INDEX_KEY

    class RecordingTrainer(ClusterTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                self.seen.append((self.state.global_step, inputs[INDEX_KEY].tolist()))
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    tokenizer = build_tokenizer()
    dataset = build_dataset(tokenizer)
    values = dict(
        output_dir=output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=8, num_train_epochs=2,
        learning_rate=1e-3, warmup_steps=3, lr_scheduler_type="linear", logging_steps=1, save_strategy="steps",
        save_steps=SAVE_STEPS, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
    )
    values.update(arg_overrides)
    trainer = RecordingTrainer(
        model=build_model(tokenizer),
        args=TrainingArguments(**values),
        train_dataset=dataset,
        eval_dataset=build_dataset(tokenizer, n=16, seed=1) if eval_dataset else None,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        processing_class=tokenizer,
        cluster_config=config or hdbscan_config(data_fraction=0.5, hdbscan_min_cluster_size=5,
                                                     feature_batch_size=16),
    )
    trainer.seen = []
    return trainer


def _pause(marker: str) -> None:
    with open(marker + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(600)  # the parent kills us here
    raise SystemExit("not killed")


def _install_pause(phase: str, marker: str, trainer) -> None:
    from transformers import TrainerCallback

    from hf_cluster_select.features import FEATURES

    if phase == "features":
        original = FEATURES.get("last_layer_grad")

        def features(model, dataset, indices, collate_fn, **kwargs):
            calls = []

            def collate(examples):
                calls.append(1)
                if len(calls) == 2:
                    _pause(marker)
                return collate_fn(examples)

            return original(model, dataset, indices, collate, **kwargs)

        FEATURES._entries["last_layer_grad"] = features
    elif phase == "clustering":
        import hdbscan

        fit = hdbscan.HDBSCAN.fit

        def paused_fit(self, *args, **kwargs):
            _pause(marker)
            return fit(self, *args, **kwargs)

        hdbscan.HDBSCAN.fit = paused_fit
    elif phase == "training":

        class Pause(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == TRAIN_PAUSE_STEP:
                    _pause(marker)

        trainer.add_callback(Pause())
    elif phase == "selection_save":
        replace = os.replace

        def paused_replace(src, dst, *args, **kwargs):
            if os.path.basename(str(src)).startswith(".cluster_selection.") and SAVE_PAUSE_CHECKPOINT in str(dst):
                _pause(marker)
            return replace(src, dst, *args, **kwargs)

        os.replace = paused_replace
    else:
        raise SystemExit(f"unknown phase {phase!r}")


def _block_network() -> list:
    """Make every outside connection fail at once (and record it): a test of 'no network' that cannot hang."""
    import socket

    attempts = []
    connect = socket.socket.connect

    def guarded(self, address, *args, **kwargs):
        if self.family == getattr(socket, "AF_UNIX", None):
            return connect(self, address, *args, **kwargs)
        attempts.append(repr(address))
        raise OSError(f"network disabled by the offline test: {address!r}")

    def no_lookup(host, *args, **kwargs):
        attempts.append(f"getaddrinfo {host!r}")
        raise socket.gaierror(f"network disabled by the offline test: {host!r}")

    socket.socket.connect = guarded
    socket.getaddrinfo = no_lookup
    return attempts


def run_offline(output_dir: str) -> dict:
    """Train with evaluation, then save the model, model card and metrics, with every connection refused."""
    import math

    attempts = _block_network()
    trainer = build_trainer(output_dir, eval_dataset=True, eval_strategy="epoch", save_strategy="no")
    result = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()
    trainer.create_model_card(model_name="tiny-offline")
    with open(os.path.join(output_dir, "README.md"), encoding="utf-8") as handle:
        card = handle.read()
    return {
        "attempts": attempts,
        "global_step": result.global_step,
        "eval_loss": metrics["eval_loss"],
        "perplexity": math.exp(metrics["eval_loss"]),
        "card_has_section": "## Data selection (hf_cluster_select)" in card,
        "logged_selection": any("cluster_select/n_kept" in h for h in trainer.state.log_history),
        "files": sorted(os.listdir(output_dir)),
    }


def run_broken_hdbscan(output_dir: str) -> dict:
    """With a broken `hdbscan` first on sys.path: the package imports, the default run fails before any model work
    with a fix-it message, and the kmeans fallback trains."""
    import hf_cluster_select
    from tiny_assets import hdbscan_config

    out: dict = {"package": hf_cluster_select.__version__}
    trainer = build_trainer(output_dir, save_strategy="no")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    try:
        trainer.train()
        out["error"] = None
    except ImportError as error:
        out["error"] = str(error)
    out["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    out["global_step_after_error"] = trainer.state.global_step
    fallback = build_trainer(output_dir, save_strategy="no", max_steps=6,
                             config=hdbscan_config(data_fraction=0.5, cluster_method="kmeans"))
    out["kmeans_global_step"] = fallback.train().global_step
    out["kmeans_n_kept"] = fallback.selection.n_kept
    out["hdbscan_module"] = repr(sys.modules.get("hdbscan"))
    return out


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--pause-at", default=None)
    parser.add_argument("--marker", default=None)
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--broken-hdbscan", action="store_true")
    args = parser.parse_args(argv)
    if args.offline:
        print(json.dumps(run_offline(args.output_dir)))
        return 0
    if args.broken_hdbscan:
        print(json.dumps(run_broken_hdbscan(args.output_dir)))
        return 0
    trainer = build_trainer(args.output_dir)
    _install_pause(args.pause_at, args.marker, trainer)
    trainer.train()
    return 1  # the parent should have killed us


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
