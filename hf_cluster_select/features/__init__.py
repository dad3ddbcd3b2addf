"""Per-example learning-effect features (layer L2): one module per signal, plus random projection."""

from .last_layer_grad import FeatureOutput, last_layer_grad_features
from .projection import RandomProjection

__all__ = ["FeatureOutput", "RandomProjection", "last_layer_grad_features"]
