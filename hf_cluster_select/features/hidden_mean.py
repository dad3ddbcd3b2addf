"""The semantic baseline signal: the mean head input over loss-bearing tokens (layer L2).

RDS+ (Ivison et al., arXiv 2503.01807) represents examples by mean-pooled hidden states and beats most complex
selectors at scale. Here the pooled vector is the input of the output head `h_t` (the last hidden state after the
final norm) at the loss-bearing positions, so it describes what the example asks the model to produce.
"""

from __future__ import annotations


from . import FEATURES
from .head_pass import signal_features


class HiddenMean:
    """Per-token `h`: `[c, H]`."""

    def token_vectors(self, hidden, logits, log_p, targets):
        return hidden


_DOC = """Per-example mean over loss-bearing tokens of the output head's input `h_t` (RDS+-style).

    Args:
        model, dataset, indices, collate_fn, **kwargs: see `head_pass.feature_pass`.
    Returns:
        `FeatureOutput`: features `[n, H]`.
    Raises:
        TypeError, ValueError: see `head_pass.feature_pass`.
    """
hidden_mean_features = FEATURES.register("hidden_mean")(signal_features(lambda kwargs: HiddenMean(), _DOC, "hidden_mean_features"))
