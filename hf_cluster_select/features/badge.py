"""BADGE's gradient embedding: the whole last-layer gradient `(p - onehot(y)) ⊗ h` (layer L2).

Ash et al., ICLR 2020 ("Deep Batch Active Learning by Diverse, Uncertain Gradient Lower Bounds"). Unlike the
target-row slice (`last_layer_grad.py`), it carries which classes the model confuses, so examples of different
classes land apart even when their `h` are alike. With `V` classes (or vocabulary tokens) the exact vector has `V·H`
entries: kept exact up to `EXACT_MAX_CLASSES` classes; above, `(p - onehot(y))` is first projected to
`PROJECTED_CLASSES` dimensions by a seeded Gaussian matrix `R [V, r]` (`(p - e_y) R ⊗ h = (R ⊗ I)ᵀ vec(g)`, a
Johnson–Lindenstrauss projection of the full gradient), so a causal LM's vocabulary costs one `[c, V] @ [V, r]`.
"""

from __future__ import annotations

import math
import torch  # noqa: F401  (signals run on tensors)

from . import FEATURES
from .head_pass import signal_features

EXACT_MAX_CLASSES = 64
PROJECTED_CLASSES = 8


class Badge:
    """Per-token `(p - onehot(y)) ⊗ h`, flattened: `[c, V·H]` (exact) or `[c, r·H]` (class axis projected).

    Args:
        seed (`int`): seed of the class-axis projection (the pipeline passes `selection_seed`).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._matrix: torch.Tensor | None = None

    def _class_matrix(self, vocab: int, device: torch.device) -> torch.Tensor | None:
        if vocab <= EXACT_MAX_CLASSES:
            return None
        if self._matrix is None or self._matrix.shape[0] != vocab:
            generator = torch.Generator().manual_seed(self.seed)
            self._matrix = torch.randn(vocab, PROJECTED_CLASSES, generator=generator) / math.sqrt(PROJECTED_CLASSES)
        return self._matrix.to(device)

    def token_vectors(self, hidden, logits, log_p, targets):
        residual = torch.softmax(logits, dim=-1)
        matrix = self._class_matrix(logits.shape[-1], logits.device)
        if matrix is None:
            residual[torch.arange(targets.numel(), device=residual.device), targets] -= 1.0
        else:
            residual = residual @ matrix - matrix[targets]
        return (residual[:, :, None] * hidden[:, None, :]).reshape(hidden.shape[0], -1)


_DOC = """Per-example mean over loss-bearing tokens of BADGE's `(p - onehot(y)) ⊗ h` (Ash et al., ICLR 2020).

    Args:
        model, dataset, indices, collate_fn, **kwargs: see `head_pass.feature_pass` (`projection_seed` also seeds
            the class-axis projection).
    Returns:
        `FeatureOutput`: features `[n, V·H]` for `V <= 64` classes, else `[n, 8·H]` (or the projection's size).
    Raises:
        TypeError, ValueError: see `head_pass.feature_pass`.
    """
badge_features = FEATURES.register("badge")(signal_features(lambda kwargs: Badge(kwargs.get("projection_seed", 0)), _DOC, "badge_features"))
