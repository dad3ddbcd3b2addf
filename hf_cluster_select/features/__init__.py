"""Feature stage (layer L2): per-example learning-effect signals, one module per signal, plus random projection.

A signal is a function `(model, dataset, indices, collate_fn, *, batch_size, lengths, projection, projection_dim,
projection_seed, normalize, show_progress, shift_labels) -> FeatureOutput` registered in `FEATURES` under the name
`ClusterSelectConfig.feature` takes: `last_layer_grad` (CluSTER's `(p_y - 1)·h`), `badge` (BADGE's
`(p - onehot(y)) ⊗ h`), `hidden_mean` (RDS+-style mean head input). All share one forward pass (`head_pass.py`).
`choice.py` says what `feature="auto"` (the default) computes for a given model.
"""

from ..registry import FEATURES

from .head_pass import FeatureOutput, feature_pass  # noqa: E402
from .last_layer_grad import last_layer_grad_features  # noqa: E402  (registers "last_layer_grad")
from .badge import badge_features  # noqa: E402  (registers "badge")
from .hidden_mean import hidden_mean_features  # noqa: E402  (registers "hidden_mean")
from .projection import RandomProjection  # noqa: E402
from .choice import AUTO_DEPTH, describe_feature, effective_layers, feature_used, resolve_feature  # noqa: E402

__all__ = ["AUTO_DEPTH", "FEATURES", "FeatureOutput", "RandomProjection", "badge_features", "describe_feature",
           "effective_layers", "feature_pass", "feature_used", "hidden_mean_features", "last_layer_grad_features",
           "resolve_feature"]
