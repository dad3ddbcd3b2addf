"""CluSTER's forward-only learning-effect signal: the target-row slice of the last-layer gradient (layer L2).

For a token with head input `h`, probabilities `p` and target `y`, row `y` of the head-weight gradient
`(p - onehot(y)) hᵀ` is `(p_y - 1) · h`. CluSTER (Kim et al., EMNLP 2026) represents an example by the mean of this
row over its loss-bearing tokens, L2-normalised; BADGE (Ash et al., ICLR 2020) uses the whole gradient (`badge.py`).
One forward pass, no backward (`head_pass.feature_pass`).
"""

from __future__ import annotations


from . import FEATURES
from .head_pass import signal_features


class LastLayerGrad:
    """Per-token `(p_y - 1) · h`: `[c, H]`."""

    def token_vectors(self, hidden, logits, log_p, targets):
        return (log_p.exp() - 1.0)[:, None] * hidden


_DOC = """Per-example mean over loss-bearing tokens of `(p_t[y_t] - 1) · h_t` (CluSTER, EMNLP 2026; BADGE, ICLR 2020).

    Args:
        model, dataset, indices, collate_fn: see `head_pass.feature_pass`.
        **kwargs: `batch_size`, `lengths`, `projection` / `projection_dim`, `normalize`, `show_progress`, `desc`,
            `shift_labels` (see `head_pass.feature_pass`).
    Returns:
        `FeatureOutput`: features `[n, H]` (H = head input size, or the projection's output size), loss-bearing
        token counts `[n]`, raw norms `[n]`, mean losses `[n]`, wall seconds.
    Raises:
        TypeError, ValueError: see `head_pass.feature_pass`.
    """
last_layer_grad_features = FEATURES.register("last_layer_grad")(signal_features(lambda kwargs: LastLayerGrad(), _DOC, "last_layer_grad_features"))
