"""Sharded selection at scale: peak memory per rank, seconds per stage and agreement with one process.

    python benchmarks/sharded_scale.py --rows 10000000 --ranks 4     # about 10 minutes on 2 cores

Data: the 32-dim, 40-component Gaussian mixture of `cluster_scale.py` (`write_select_memmap`), written once to a
float32 file. Two cells, each in fresh processes on an idle machine:

- `one_process`: `select_sharded` in one process over the whole memory-mapped matrix;
- `ranks`: `torchrun --nproc_per_node=R` over gloo; rank r maps the file and passes rows
  `[r·n/R, (r+1)·n/R)` (a contiguous shard, as a rank's own feature file would be) to `select_sharded`.

Per rank: wall seconds, `stage_seconds`, resident memory before selection and its peak (`VmHWM`, MiB: read pages of
the mapped shard count), against the bytes of the rank's shard and of the fit sample. The two cells' selections are
compared (`identical`: same indices, labels and weights), and the homogeneity of the kept examples' clusters with
the mixture components is reported. Writes `benchmarks/results/sharded_scale.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
from cluster_scale import peak_rss_mib, write_select_memmap  # noqa: E402

DIM = 32


def _resident_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(path: str, n: int, out: str) -> None:
    """One process of a cell: select from this rank's contiguous shard of the mapped file; write what it measured
    (`out/rank<r>.json`) and the selection (`out/rank<r>.npz`)."""
    import torch

    from hf_cluster_select import ClusterSelectConfig, distributed
    from hf_cluster_select.selection.sharded import select_sharded

    if "RANK" in os.environ:
        torch.distributed.init_process_group("gloo")
    rank, world = distributed.rank(), distributed.world_size()
    x = np.memmap(path, dtype=np.float32, mode="r").reshape(n, DIM)
    start, stop = rank * n // world, (rank + 1) * n // world
    before = _resident_mib()
    began = time.perf_counter()
    selection = select_sharded(x[start:stop], np.arange(start, stop), n, ClusterSelectConfig(data_fraction=0.3))
    seconds = time.perf_counter() - began
    record = {"rank": rank, "world_size": world, "rows": stop - start, "seconds": seconds,
              "stage_seconds": selection.stage_seconds, "resident_before_mib": before, "peak_rss_mib": peak_rss_mib(),
              "shard_mib": (stop - start) * DIM * 4 / 2**20, "n_kept": selection.n_kept,
              "n_clusters": int(selection.labels.max()) + 1}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    if rank == 0:
        np.savez(os.path.join(out, "selection.npz"), indices=selection.indices, weights=selection.weights,
                 labels=selection.labels)
    if world > 1:
        torch.distributed.destroy_process_group()


def run_cell(path: str, n: int, ranks: int, out: str, timeout: float) -> list[dict]:
    """One cell in fresh processes (plain `python` for one rank, `torchrun` otherwise); its per-rank records."""
    script = [os.path.abspath(__file__), "--worker", path, str(n), out]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    command = [sys.executable, *script] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
        "--master_port=29577", *script]
    subprocess.run(command, check=True, timeout=timeout, env=env, cwd=ROOT)
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(ranks)]


def markdown(result: dict) -> str:
    """Per cell and rank: rows, seconds, resident memory before and at peak, the shard's bytes."""
    lines = [f"`select_sharded`, {result['rows']:,} × {DIM} float32 rows (memory-mapped), data_fraction 0.3; "
             f"same selection in both cells: {result['identical']}; homogeneity of the kept examples' clusters "
             f"{result['homogeneity']:.3f}", "",
             "| cell | rank | rows | seconds | MiB before | peak MiB | shard MiB |", "|---|---|---|---|---|---|---|"]
    for cell, records in result["cells"].items():
        for r in records:
            lines.append(f"| {cell} | {r['rank']} | {r['rows']:,} | {r['seconds']:.1f} | "
                         f"{r['resident_before_mib']:.0f} | {r['peak_rss_mib']:.0f} | {r['shard_mib']:.0f} |")
    names = list(dict.fromkeys(k for records in result["cells"].values() for k in records[0]["stage_seconds"]))
    lines += ["", "| cell | rank | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for cell, records in result["cells"].items():
        for r in records:
            lines.append(f"| {cell} | {r['rank']} | " + " | ".join(
                f"{r['stage_seconds'].get(name, 0.0):.1f}" for name in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], int(argv[2]), argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per cell")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sharded_scale.json"))
    bench_io.add_report_option(parser)
    args = parser.parse_args(argv)
    if bench_io.print_report(args.report, markdown):
        return 0
    from sklearn.metrics import homogeneity_score

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "features.f32")
        write_select_memmap(args.rows, path, dim=DIM)
        truth = np.load(path + ".truth.npy")
        cells, selections = {}, {}
        for name, ranks in (("one_process", 1), (f"{args.ranks}_ranks", args.ranks)):
            out = os.path.join(folder, name)
            cells[name] = run_cell(path, args.rows, ranks, out, args.timeout)
            selections[name] = dict(np.load(os.path.join(out, "selection.npz")))
            print(json.dumps({name: cells[name]}), flush=True)
    one, many = selections.values()
    identical = all(np.array_equal(one[k], many[k]) for k in ("indices", "labels")) and np.allclose(
        one["weights"], many["weights"], rtol=1e-12)
    result = {"what": "select_sharded: peak memory per rank and seconds per stage, one process vs torchrun ranks "
                      "(gloo), 32-dim Gaussian mixture (cluster_scale.py), data_fraction 0.3",
              "rows": args.rows, "identical": bool(identical),
              "homogeneity": float(homogeneity_score(truth[one["indices"]], one["labels"])),
              "fit_sample_mib": 20000 * DIM * 8 / 2**20, "cells": cells,
              "environment": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                              "commit": os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()}}
    bench_io.write_json(args.out, result)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
