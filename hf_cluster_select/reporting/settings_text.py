"""How the settings a run resolved read in the model card (`model_card.py`) and `hf-cluster-select report`
(`commands.py`): one phrase per setting, from the report's `clustering_params`."""

from __future__ import annotations

from ..settings import NOISY_POOL_RATE


def duplicate_settings(params: dict) -> str:
    """The near-duplicate settings a run used (`"auto"` resolved), e.g. `near_duplicate_threshold=0.7,
    duplicate_weight='one'`; the setting's name alone for reports written before they were recorded."""
    if params.get("near_duplicate_threshold") is None:
        return "near_duplicate_threshold"
    return (f"near_duplicate_threshold={params['near_duplicate_threshold']:g}, "
            f"duplicate_weight={params.get('duplicate_weight')!r}")


def noise_settings(params: dict) -> str:
    """The noise filter's share as it ran, e.g. `noise_share=0.2`, or when `"auto"` estimated the noise rate
    `noise_share=0.38 (auto: estimated noise rate 0.38; the estimate from 0.3, else 0.2)`."""
    if params.get("noise_share_applied") is None:
        return f"noise_share={params.get('noise_share')}"
    return (f"noise_share={params['noise_share_applied']:g} (auto: estimated noise rate "
            f"{params.get('noise_rate_estimate'):g}; the estimate from {NOISY_POOL_RATE:g}, else "
            f"{params.get('noise_share'):g})")
