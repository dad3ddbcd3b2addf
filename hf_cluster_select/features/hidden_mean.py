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


_CALL_DOC = """
    Args:
        model, dataset, indices, collate_fn, **kwargs: see `head_pass.feature_pass`.
    Returns:
        `FeatureOutput`: features `[n, H]`.
    Raises:
        TypeError, ValueError: see `head_pass.feature_pass`.
    """  # the arguments, output and errors of both signals here
_DOC = "Per-example mean over loss-bearing tokens of the output head's input `h_t` (RDS+-style).\n" + _CALL_DOC
hidden_mean_features = FEATURES.register("hidden_mean")(signal_features(lambda kwargs: HiddenMean(), _DOC, "hidden_mean_features"))


class HiddenWeightedMean(HiddenMean):
    """Per-token `h` weighted by its rank among the example's loss tokens (RDS+'s position weighting)."""

    position_weighted = True


_WEIGHTED_DOC = """Per-example position-weighted mean over loss-bearing tokens of the output head's input `h_t`: the t-th
    loss-bearing token weighs t, so later tokens (which have seen more of the answer) count more — the pooling of
    RDS+ (Ivison et al., arXiv 2503.01807, Sec. 3; their `compute_influence_cosinesim.py`). Features are returned
    as `sum_t t · h_t / c` (c = loss tokens), the position-weighted mean times (c + 1) / 2: the same direction.
""" + _CALL_DOC
hidden_weighted_mean_features = FEATURES.register("hidden_weighted_mean")(
    signal_features(lambda kwargs: HiddenWeightedMean(), _WEIGHTED_DOC, "hidden_weighted_mean_features"))
