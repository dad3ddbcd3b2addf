"""Selection overhead of a target set: ClusterTrainer's selection seconds with and without `target_dataset`.

    python benchmarks/target_overhead.py          # ~5 minutes on 2 idle CPU cores → results/target_overhead.json

On the pool of `benchmarks/targeted.py` (Natural-Instructions, 32 rows × 16 skills, SmolLM2-135M-Instruct LoRA,
`feature="auto"` = hidden_mean after 20 of 30 blocks), one `train()` with `max_steps=1` and
`selection_warmup_steps=0` per measurement, feature cache off (a cold feature pass every time): `selection_seconds`
of the report (features of the pool — and of the target — plus clustering and choosing) untargeted, and with a target
of 4 skills × 8 rows (`target_column`), alternated `--repeats` times in the same process. Writes the medians and
their ratio (issue 21 asks for at most +10 %). Run it alone: timings on 2 shared cores swing by more than 10×.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_io  # noqa: E402
import targeted  # noqa: E402


def selection_seconds(data: dict, target, work: str) -> float:
    """`selection_seconds` of one cold `ClusterTrainer.train()` (max_steps 1, no warm-up, no feature cache)."""
    from transformers import TrainingArguments

    from hf_cluster_select import ClusterSelectConfig, ClusterTrainer

    config = ClusterSelectConfig(data_fraction=0.1, selection_warmup_steps=0, feature_cache=False,
                                 strategy_kwargs={"target_column": "skill"} if target is not None else None)
    args = TrainingArguments(output_dir=work, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                             max_steps=1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = ClusterTrainer(model=data["make_model"](0), args=args, train_dataset=data["pool"],
                             data_collator=data["collator"], cluster_config=config, target_dataset=target)
    trainer.train()
    return float(trainer.selection_report.selection_seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "target_overhead.json"))
    args = parser.parse_args(argv)
    data = targeted.build_data(per_skill_pool=32, per_skill_eval=8)
    target = targeted.target_dataset(data, [0, 5, 10, 15])
    seconds = {"untargeted": [], "targeted": []}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.repeats):
            seconds["untargeted"].append(selection_seconds(data, None, work))
            seconds["targeted"].append(selection_seconds(data, target, work))
            print(seconds, flush=True)
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    result = {"pool_rows": len(data["pool"]), "target_rows": len(target), "repeats": args.repeats,
              "seconds": seconds, "median_seconds": medians,
              "overhead_fraction": medians["targeted"] / medians["untargeted"] - 1.0,
              "commit": os.popen(f"git -C {HERE} rev-parse --short HEAD").read().strip()}
    bench_io.write_json(args.out, result)
    print(f"selection seconds, median of {args.repeats}: untargeted {medians['untargeted']:.1f} s, with a target of "
          f"{len(target)} rows {medians['targeted']:.1f} s ({result['overhead_fraction']:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
