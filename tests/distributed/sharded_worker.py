"""torchrun worker for `select_sharded`: every rank selects from its own shard of a seeded pool.

    python -m torch.distributed.run --nproc_per_node=4 --master_port PORT tests/distributed/sharded_worker.py OUT

Rank r holds the rows `permutation[r::world]` of each pool of `sharded_pools.py` (not in dataset order) and writes
`OUT/<pool>/rank<r>.npz` with the `Selection` it returned (indices, weights, labels).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository (hf_cluster_select)

from sharded_pools import POOLS, pool, shard_of  # noqa: E402

from hf_cluster_select.selection.sharded import select_sharded  # noqa: E402


def main(out: str) -> None:
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for name in POOLS:
        data = pool(name)
        local = shard_of(data["features"].shape[0], rank, world)
        selection = select_sharded(
            data["features"][local], local, data["features"].shape[0], data["config"],
            **{key: data[key][local] for key in ("loss_tokens", "norms", "losses") if key in data})
        os.makedirs(os.path.join(out, name), exist_ok=True)
        np.savez(os.path.join(out, name, f"rank{rank}.npz"), indices=selection.indices, weights=selection.weights,
                 labels=selection.labels)
    _bad_inputs(out, rank, world)
    torch.distributed.destroy_process_group()


def _bad_inputs(out: str, rank: int, world: int) -> None:
    """Inputs wrong on one rank or across ranks; every rank records the message it raised (`OUT/errors`)."""
    import json

    from hf_cluster_select import ClusterSelectConfig

    data = pool("plain")
    n, local = data["features"].shape[0], shard_of(data["features"].shape[0], rank, world)
    overlap = local.copy()
    if rank == 1:
        overlap[0] = shard_of(n, 0, world)[0]  # held by ranks 0 and 1; rank 1's own first index by nobody
    cases = {
        "overlap": (overlap, data["config"]),
        "config": (local, ClusterSelectConfig(data_fraction=0.31) if rank == 1 else data["config"]),
        "one_rank": (local[:-1] if rank == world - 1 else local, data["config"]),
    }
    messages = {}
    for name, (indices, config) in cases.items():
        try:
            select_sharded(data["features"][local], indices, n, config)
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    os.makedirs(os.path.join(out, "errors"), exist_ok=True)
    with open(os.path.join(out, "errors", f"rank{rank}.json"), "w") as handle:
        json.dump(messages, handle)


if __name__ == "__main__":
    main(sys.argv[1])
