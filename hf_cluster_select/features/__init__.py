"""Feature stage (layer L2): per-example learning-effect signals, one module per signal, plus random projection.

A signal is a function `(model, dataset, indices, collate_fn, *, batch_size, lengths, projection, show_progress,
shift_labels) -> FeatureOutput` registered in `FEATURES` under the name `ClusterSelectConfig.feature` takes.
"""

from ..registry import Registry

FEATURES: Registry = Registry("feature")

from .last_layer_grad import FeatureOutput, last_layer_grad_features  # noqa: E402  (registers "last_layer_grad")
from .projection import RandomProjection  # noqa: E402

__all__ = ["FEATURES", "FeatureOutput", "RandomProjection", "last_layer_grad_features"]
