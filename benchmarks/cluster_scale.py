"""Clustering at scale: seconds, peak memory and agreement of exact and sampled fits, 10k to 1M rows.

    python benchmarks/cluster_scale.py                      # 10k, 100k, 1M rows x 32 dims (about 20 minutes)
    python benchmarks/cluster_scale.py --sizes 10000 --quick

Data: a seeded Gaussian mixture with known labels (40 components of unequal weight, 32 dims, component centres at
distance ~8σ), so agreement with the truth (ARI) is measurable. For every size, in one process on an idle machine:

- `hdbscan_exact` (`cluster_method="hdbscan"`, `cluster_sample_size=None`), only up to `--exact-limit` rows;
- `hdbscan_sampled` (the default `cluster_sample_size`, 20,000): fit on a seeded sample, nearest exemplar for the
  rest; and `hdbscan.approximate_predict` on the same sample fit (`prediction_data=True`), for comparison;
- `fine_kmeans_exact` (up to `--exact-limit` rows) and `fine_kmeans` (two-level above the sample size) at
  `data_fraction=0.3`, where agreement is the homogeneity of the fine clusters with the truth (each fine cluster
  should lie inside one component);
- `select_defaults`: the public path a user calls, `cluster_features` then `select_subset` with
  `ClusterSelectConfig(data_fraction=0.3)` and every other default, with its seconds per stage (screen, dedup, PCA,
  fit, assign, outputs; units, quotas, within-cluster rule, weights: `SelectionReport.stage_seconds`);
  `--methods select_defaults` runs only it;
- `select_defaults_memmap` (`--select-memmap-rows`, e.g. 10,000,000): the same public path on a 32-dim float32
  matrix that the parent wrote to a file and the cell maps read-only (`np.memmap`), so the cell's peak memory is
  what selection holds, not the data;
- `fine_kmeans_memmap`: 600k rows × 1,024 dims (2.3 GiB float32) in a memory-mapped file, above the 2 GiB limit
  where `cluster_features` reads rows in blocks; its peak memory against the size of the matrix.

Each cell records wall seconds, the peak resident memory of a child process that ran only that cell (MiB), ARI /
homogeneity with the truth, and ARI with the exact fit where it ran. Writes `benchmarks/results/cluster_scale.json`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402


def mixture(n: int, dim: int = 32, k: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`[n, dim]` float32 rows of a k-component Gaussian mixture with Zipf-like weights, and their components."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * (8.0 / np.sqrt(2 * dim))  # centre pairs ~8 sigma apart
    weights = 1.0 / np.arange(1, k + 1) ** 0.7
    truth = rng.choice(k, size=n, p=weights / weights.sum())
    x = centres[truth] + rng.normal(size=(n, dim))
    return x.astype(np.float32), truth


MEMMAP_DIM = 1024  # the memory-mapped cell: n x 1024 float32 rows (above the 2 GiB in-memory limit at 600k)


def memmap_mixture(n: int, path: str, dim: int = MEMMAP_DIM) -> tuple[np.ndarray, np.ndarray]:
    """The mixture in `dim` dims written block by block to a float32 memory-mapped file (never all in RAM)."""
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(40, dim)) * (8.0 / np.sqrt(2 * dim))
    weights = 1.0 / np.arange(1, 41) ** 0.7
    truth = rng.choice(40, size=n, p=weights / weights.sum())
    mapped = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, dim))
    for start in range(0, n, 50_000):
        part = truth[start: start + 50_000]
        mapped[start: start + part.size] = centres[part] + rng.normal(size=(part.size, dim))
    mapped.flush()
    return np.memmap(path, dtype=np.float32, mode="r", shape=(n, dim)), truth


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB): `VmHWM` of /proc/self/status where there is one (the peak of this
    process's own address space; `ru_maxrss` would keep the spawning parent's peak across exec), else `ru_maxrss`.
    Pages of a memory-mapped file that were read count as resident."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cell(queue, method: str, n: int, sample_size, path: str | None = None):
    from sklearn.metrics import adjusted_rand_score, homogeneity_score

    from hf_cluster_select import ClusterSelectConfig
    from hf_cluster_select.selection import cluster_features, select_subset

    extra = {}
    if method == "select_defaults_memmap":  # written by the parent (`write_select_memmap`): this process only reads
        x = np.memmap(path, dtype=np.float32, mode="r").reshape(n, -1)
        truth = np.load(path + ".truth.npy")
        extra["feature_gib"] = x.nbytes / 2**30
        extra["rss_before_clustering_mib"] = peak_rss_mib()
    elif method == "fine_kmeans_memmap":
        path = f"/tmp/cluster_scale_{os.getpid()}.f32"
        x, truth = memmap_mixture(n, path)
        extra["feature_gib"] = x.nbytes / 2**30
        extra["rss_before_clustering_mib"] = peak_rss_mib()
    else:
        x, truth = mixture(n)
    start = time.perf_counter()
    if method.startswith("select_defaults"):  # the public path with every default, as a user calls it
        config = ClusterSelectConfig(data_fraction=0.3)
        result = cluster_features(x, config)
        selection = select_subset(result, config)
        labels = result.labels
        extra.update(n_clusters=int(result.n_clusters), n_kept=selection.n_kept,
                     sampled_rows=result.params.get("sampled_rows"),
                     stage_seconds={**result.params["stage_seconds"], **selection.stage_seconds})
    elif method == "hdbscan_approximate_predict":
        import hdbscan

        from hf_cluster_select.selection.clustering import _l2_normalise
        from hf_cluster_select.selection.sampled import seeded_sample
        from sklearn.decomposition import PCA

        rows = _l2_normalise(x.astype(np.float64))
        sample = seeded_sample(n, sample_size, 0)
        sample = np.arange(n) if sample is None else sample
        pca = PCA(n_components=16, random_state=0).fit(rows[sample])
        reduced = pca.transform(rows)
        config = ClusterSelectConfig(cluster_method="hdbscan")
        model = hdbscan.HDBSCAN(min_cluster_size=config.cluster_settings.resolved_min_cluster_size(sample.size), min_samples=1,
                                prediction_data=True).fit(reduced[sample])
        labels, _ = hdbscan.approximate_predict(model, reduced)
        extra["noise_fraction"] = float((labels < 0).mean())
    else:
        cluster_method = "hdbscan" if method.startswith("hdbscan") else "fine_kmeans"
        config = ClusterSelectConfig(cluster_method=cluster_method, data_fraction=0.3, strategy_kwargs={"cluster_sample_size": sample_size})
        result = cluster_features(x, config)
        labels = result.labels
        extra.update(n_clusters=int(result.n_clusters), noise_fraction=float(result.n_noise / n),
                     sampled_rows=result.params.get("sampled_rows"))
    seconds = time.perf_counter() - start
    if method == "fine_kmeans_memmap":
        os.unlink(path)
    fine = "kmeans" in method or method.startswith("select_defaults")
    score = homogeneity_score if fine else adjusted_rand_score
    queue.put(dict(method=method, n=n, seconds=seconds, truth_agreement=float(score(truth, labels)),
                   agreement_kind="homogeneity" if fine else "ARI",
                   peak_rss_mib=peak_rss_mib(), labels=labels, **extra))


def write_select_memmap(n: int, path: str, dim: int = 32) -> None:
    """The 32-dim mixture of `mixture` (other draws), `n` rows written block by block to the float32 file `path`,
    its components to `path + ".truth.npy"`: for `select_defaults_memmap`, which maps it read-only."""
    _, truth = memmap_mixture(n, path, dim=dim)
    np.save(path + ".truth.npy", truth)


def run_cell(method: str, n: int, sample_size, timeout: float, path: str | None = None) -> dict:
    """One cell in a fresh child process (peak memory is that cell's); `timed_out` after `timeout` seconds."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_cell, args=(queue, method, n, sample_size, path))
    process.start()
    try:
        return queue.get(timeout=timeout)
    except Exception:  # queue.Empty: the cell ran past its limit
        return dict(method=method, n=n, timed_out=True, seconds=timeout)
    finally:
        process.terminate()
        process.join()


def markdown(result: dict) -> str:
    """The README table: per method and size, seconds, peak memory and agreement."""
    lines = ["| method | rows | seconds | peak MiB | agreement with truth | ARI with the exact fit |", "|---|---|---|---|---|---|"]
    for cell in result["cells"]:
        if cell.get("timed_out"):
            lines.append(f"| {cell['method']} | {cell['n']:,} | > {cell['seconds']:.0f} (stopped) | | | |")
            continue
        exact = cell.get("ari_with_exact_fit")
        lines.append(f"| {cell['method']} | {cell['n']:,} | {cell['seconds']:.1f} | {cell['peak_rss_mib']:.0f} | "
                     f"{cell['agreement_kind']} {cell['truth_agreement']:.3f} | "
                     f"{'' if exact is None else f'{exact:.3f}'} |")
    staged = [cell for cell in result["cells"] if cell.get("stage_seconds")]
    if staged:
        names = list(dict.fromkeys(name for cell in staged for name in cell["stage_seconds"]))
        lines += ["", "Seconds per stage of `cluster_features` + `select_subset` with the defaults (data_fraction 0.3):",
                  "", "| rows | total | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for cell in staged:
            stages = cell["stage_seconds"]
            lines.append(f"| {cell['n']:,} | {cell['seconds']:.1f} | "
                         + " | ".join(f"{stages[name]:.2f}" if name in stages else "" for name in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--exact-limit", type=int, default=100_000, help="largest n for the exact fits")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per cell")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="only these cells (e.g. select_defaults: the public path with the defaults, per stage)")
    parser.add_argument("--memmap-rows", type=int, default=600_000,
                        help="rows of the memory-mapped 1024-dim cell (2.3 GiB at 600k); 0 = skip it")
    parser.add_argument("--select-memmap-rows", type=int, default=0,
                        help="rows of the memory-mapped 32-dim cell of the public path (select_defaults_memmap, "
                             "e.g. 10000000: 1.2 GiB float32); 0 = skip it")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "cluster_scale.json"))
    bench_io.add_report_option(parser)
    args = parser.parse_args(argv)
    if bench_io.print_report(args.report, markdown):
        return 0
    from hf_cluster_select import ClusterSelectConfig
    from sklearn.metrics import adjusted_rand_score

    sample_size = ClusterSelectConfig().cluster_settings.cluster_sample_size
    cells = []
    for n in args.sizes:
        exact = {}
        plan = [("hdbscan_exact", None), ("fine_kmeans_exact", None)] if n <= args.exact_limit else []
        plan += [("hdbscan_sampled", sample_size), ("hdbscan_approximate_predict", sample_size),
                 ("fine_kmeans", sample_size), ("select_defaults", sample_size)]
        plan = [(m, s) for m, s in plan if args.methods is None or m in args.methods]
        for method, size in plan:
            cell = run_cell(method, n, size, args.timeout)
            labels = cell.pop("labels", None)
            if method.endswith("_exact") and labels is not None:
                exact[method.split("_exact")[0]] = labels
            base = exact.get("hdbscan" if method.startswith("hdbscan") else "fine_kmeans")
            if labels is not None and base is not None and not method.endswith("_exact"):
                cell["ari_with_exact_fit"] = float(adjusted_rand_score(base, labels))
            cells.append(cell)
            print(json.dumps(cell), flush=True)
    if args.memmap_rows and (args.methods is None or "fine_kmeans_memmap" in args.methods):
        cell = run_cell("fine_kmeans_memmap", args.memmap_rows, sample_size, args.timeout)
        cell.pop("labels", None)
        cells.append(cell)
        print(json.dumps(cell), flush=True)
    if args.select_memmap_rows:
        path = os.path.join(tempfile.gettempdir(), f"cluster_scale_select_{os.getpid()}.f32")
        try:
            write_select_memmap(args.select_memmap_rows, path)
            cell = run_cell("select_defaults_memmap", args.select_memmap_rows, sample_size, args.timeout, path)
        finally:
            for leftover in (path, path + ".truth.npy"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        cell.pop("labels", None)
        cells.append(cell)
        print(json.dumps(cell), flush=True)
    out = {"what": "clustering seconds, peak memory and agreement at scale (Gaussian mixture, 40 components, 32 dims)",
           "cluster_sample_size": sample_size, "cells": cells,
           "environment": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                           "commit": os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()}}
    if not args.quick:
        bench_io.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
