"""Seeded dense Gaussian random projection of feature vectors (layer L2).

A Johnson–Lindenstrauss projection (Johnson & Lindenstrauss, 1984) maps `in_dim`-dimensional vectors to `out_dim`
dimensions with a matrix of i.i.d. N(0, 1/out_dim) entries, so that squared norms and pairwise distances are preserved
in expectation (and, with high probability, up to a factor 1 ± ε for out_dim = O(log n / ε²)). LESS (Xia et al.,
ICML 2024) uses such projections to shrink per-example gradients before comparing them.
"""

from __future__ import annotations

import math

import torch


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}.")
    return value


class RandomProjection:
    """Seeded dense Gaussian Johnson–Lindenstrauss projection `x ↦ x @ M`, `M[i, j] ~ N(0, 1/out_dim)`.

    The matrix is drawn once, on CPU, from a `torch.Generator` seeded with `seed`, so every machine and every rank
    builds the identical projection without communicating. It is copied to the input's device on first use there.
    Memory: `in_dim × out_dim × 4` bytes (e.g. 2 MiB for 4096 → 128).

    Args:
        in_dim (`int`): dimension of the vectors to project, >= 1.
        out_dim (`int`): dimension after projection, >= 1.
        seed (`int`): seed of the matrix (the pipeline passes `selection_seed`); the same seed gives the same matrix everywhere.
    Raises:
        TypeError: if an argument is not an int.
        ValueError: if `in_dim` or `out_dim` is below 1.
    """

    def __init__(self, in_dim: int, out_dim: int, seed: int) -> None:
        self.in_dim = _check_positive_int("in_dim", in_dim)
        self.out_dim = _check_positive_int("out_dim", out_dim)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"`seed` must be an int, got {seed!r}.")
        self.seed = seed
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.matrix = torch.randn(in_dim, out_dim, generator=generator, dtype=torch.float32) / math.sqrt(out_dim)
        self._on_device: dict[torch.device, torch.Tensor] = {self.matrix.device: self.matrix}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Project the rows of `x`.

        Args:
            x (`torch.Tensor` of shape `[n, in_dim]`): vectors to project, any float dtype, any device.
        Returns:
            `torch.Tensor` of shape `[n, out_dim]`, float32, on `x`'s device.
        Raises:
            TypeError: if `x` is not a tensor.
            ValueError: if `x` is not 2-D or its last dimension is not `in_dim`.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}.")
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"`x` must have shape [n, {self.in_dim}], got {list(x.shape)}.")
        matrix = self._on_device.get(x.device)
        if matrix is None:
            with torch.inference_mode(False):  # a normal tensor, usable later outside inference mode too
                matrix = self.matrix.to(x.device)
            self._on_device[x.device] = matrix
        return x.to(torch.float32) @ matrix

    def __repr__(self) -> str:
        return f"RandomProjection(in_dim={self.in_dim}, out_dim={self.out_dim}, seed={self.seed})"
