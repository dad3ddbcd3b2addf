"""Rank/world helpers and cross-rank exchange of features and selections (layer L1).

Everything goes through `torch.distributed` as initialised by torchrun / accelerate (gloo on CPU, NCCL on GPU);
nothing is exchanged through files. With no process group every helper is the identity.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a `torch.distributed` process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of processes in the default group (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def shard_indices(n_examples: int, num_shards: int, shard: int) -> list[int]:
    """Indices `shard, shard + num_shards, ...` of `range(n_examples)`: rank `shard`'s part of a strided split.

    Args:
        n_examples (`int`): size of the dataset (>= 0).
        num_shards (`int`): world size (>= 1).
        shard (`int`): this rank, in `[0, num_shards)`.
    Returns:
        `list[int]` of the indices this shard owns; shard sizes differ by at most one.
    Raises:
        ValueError: if an argument is out of range.
    """
    if n_examples < 0:
        raise ValueError(f"`n_examples` must be >= 0, got {n_examples}.")
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"`shard` must be in [0, num_shards={num_shards}), got {shard}.")
    return list(range(shard, n_examples, num_shards))


def _communication_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_rows(local_rows: torch.Tensor, local_indices: Sequence[int], n_examples: int,
                dst: int | None = None) -> torch.Tensor | None:
    """Assemble per-rank rows into one `[n_examples, ...]` tensor in dataset order, on every rank or on rank `dst`.

    Ranks may hold different numbers of rows: each pads to the largest count, all-gathers (or gathers to `dst`:
    then the other ranks never hold more than their own rows and one padded copy of them), and drops the padding.

    Args:
        local_rows (`torch.Tensor` of shape `[n_local, ...]`): this rank's rows (e.g. features `[n_local, dim]`).
        local_indices (sequence of `int`, length `n_local`): the dataset index of each local row.
        n_examples (`int`): total number of rows; the union of all ranks' indices must be `range(n_examples)`.
        dst (`int`, *optional*): the only rank that receives the rows (`torch.distributed.gather`); `None` = every
            rank (`all_gather`).
    Returns:
        `torch.Tensor` of shape `[n_examples, ...]` on CPU, row `i` = the row some rank computed for index `i`;
        `None` on the ranks other than `dst` when `dst` is given.
    Raises:
        ValueError: if `local_indices` does not match `local_rows`, `dst` is not a rank, or the gathered indices do
            not cover `range(n_examples)` exactly once.
    """
    if len(local_indices) != local_rows.shape[0]:
        raise ValueError(
            f"`local_indices` has {len(local_indices)} entries but `local_rows` has {local_rows.shape[0]} rows."
        )
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < world_size()):
        raise ValueError(f"`dst` must be a rank in [0, {world_size()}) or None, got {dst!r}.")
    index_tensor = torch.as_tensor(list(local_indices), dtype=torch.int64)
    if is_distributed():
        device = _communication_device()
        count = torch.tensor([local_rows.shape[0]], dtype=torch.int64, device=device)
        counts = [torch.zeros_like(count) for _ in range(world_size())]
        dist.all_gather(counts, count)
        counts_list = [int(c.item()) for c in counts]
        longest = max(counts_list)
        padded = torch.zeros((longest, *local_rows.shape[1:]), dtype=local_rows.dtype, device=device)
        padded[: local_rows.shape[0]] = local_rows.to(device)
        padded_index = torch.full((longest,), -1, dtype=torch.int64, device=device)
        padded_index[: index_tensor.shape[0]] = index_tensor.to(device)
        receives = dst is None or rank() == dst
        all_rows = [torch.zeros_like(padded) for _ in counts_list] if receives else None
        all_index = [torch.zeros_like(padded_index) for _ in counts_list] if receives else None
        if dst is None:
            dist.all_gather(all_rows, padded)
            dist.all_gather(all_index, padded_index)
        else:
            dist.gather(padded, all_rows, dst=dst)
            dist.gather(padded_index, all_index, dst=dst)
            if not receives:
                return None
        rows = torch.cat([r[:c].cpu() for r, c in zip(all_rows, counts_list)])
        index_tensor = torch.cat([i[:c].cpu() for i, c in zip(all_index, counts_list)])
    else:
        rows = local_rows.cpu()
    if index_tensor.numel() != n_examples or not torch.equal(
        torch.sort(index_tensor).values, torch.arange(n_examples, dtype=torch.int64)
    ):
        raise ValueError(f"the gathered indices do not cover range({n_examples}) exactly once.")
    if torch.equal(index_tensor, torch.arange(n_examples, dtype=torch.int64)):
        return rows  # already in dataset order (one process): no copy, so memory-mapped features stay on disk
    out = torch.empty((n_examples, *rows.shape[1:]), dtype=rows.dtype)
    out[index_tensor] = rows
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Send a picklable object from rank `src` to every rank (identity without a process group).

    Args:
        obj (`Any`): the object on rank `src`; ignored on other ranks.
        src (`int`, *optional*, defaults to `0`): the sending rank.
    Returns:
        The object of rank `src`, on every rank.
    """
    if not is_distributed():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src, device=_communication_device())
    return box[0]


def gather_objects(obj: Any) -> list:
    """All-gather one picklable object from every rank (`[obj]` without a process group).

    Returns:
        `list` of length `world_size`: entry `r` is rank `r`'s object, on every rank.
    """
    if not is_distributed():
        return [obj]
    out: list = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_floats(values: Sequence[float]) -> torch.Tensor:
    """All-gather a few numbers from every rank (one small collective; every rank must call it with as many values).

    Args:
        values (sequence of `float`, length `k`): this rank's numbers (e.g. padded tokens processed in one step).
    Returns:
        `torch.Tensor` of shape `[world_size, k]`, float64, on CPU: row `r` holds rank `r`'s values (one row
        without a process group).
    """
    local = torch.as_tensor([float(v) for v in values], dtype=torch.float64).reshape(1, -1)
    if not is_distributed():
        return local
    device = _communication_device()
    local = local.to(device)
    rows = [torch.zeros_like(local) for _ in range(world_size())]
    dist.all_gather(rows, local)
    return torch.cat(rows).cpu()



def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of a tensor over ranks (`all_reduce`; identity without a process group).

    Args:
        values (`torch.Tensor`, any shape, int64 or float64 for exact sums): this rank's values; every rank passes
            the same shape and dtype.
    Returns:
        `torch.Tensor` of the same shape on CPU: the sum over ranks.
    """
    if not is_distributed():
        return values.cpu()
    on_device = values.to(_communication_device())
    dist.all_reduce(on_device)
    return on_device.cpu()


def exchange_rows(parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """All-to-all of rows, point to point: `parts[r]` goes to rank `r`, and what each rank sent here comes back.

    Rows go pairwise in `world_size − 1` rounds (round `s`: send to `rank + s`, receive from `rank − s`), so a rank
    holds its own parts and what it received, never another pair's rows; the row counts travel first (one small
    all-gather). Works on gloo (CPU) and NCCL.

    Args:
        parts (sequence of `torch.Tensor`, length `world_size`): `parts[r]` of shape `[n_r, ...]` for rank `r`; every
            part on every rank has the same trailing shape and dtype.
    Returns:
        `list[torch.Tensor]` of length `world_size`, on CPU: entry `r` holds the rows rank `r` sent to this rank.
    Raises:
        ValueError: if `parts` does not hold one tensor per rank.
    """
    world, me = world_size(), rank()
    if len(parts) != world:
        raise ValueError(f"`parts` must hold one tensor per rank ({world}), got {len(parts)}.")
    if world == 1:
        return [parts[0].cpu()]
    counts = gather_floats([p.shape[0] for p in parts]).to(torch.int64)  # [sender, receiver]
    device = _communication_device()
    received: list[torch.Tensor] = [parts[me].cpu()] * world
    for step in range(1, world):
        to, frm = (me + step) % world, (me - step) % world
        out = parts[to].contiguous().to(device)
        into = torch.empty((int(counts[frm, me]), *parts[me].shape[1:]), dtype=parts[me].dtype, device=device)
        requests = [dist.isend(out, to), dist.irecv(into, frm)]
        for request in requests:
            request.wait()
        received[frm] = into.cpu()
    return received
