"""How the settings a run resolved read in the model card (`model_card.py`) and `hf-cluster-select report`
(`commands.py`): one phrase per setting, from the report's `clustering_params`."""

from __future__ import annotations

from ..settings import AUTO, MAX_AUTO_SHARE, NOISY_POOL_RATE, NOISY_REPLY_SHARE, resolve_reset_optimizer_state


def duplicate_settings(params: dict) -> str:
    """The near-duplicate settings a run used (`"auto"` resolved), e.g. `near_duplicate_threshold=0.7,
    duplicate_weight='one'`; the setting's name alone for reports written before they were recorded."""
    if params.get("near_duplicate_threshold") is None:
        return "near_duplicate_threshold"
    return (f"near_duplicate_threshold={params['near_duplicate_threshold']:g}, "
            f"duplicate_weight={params.get('duplicate_weight')!r}")


def noise_settings(params: dict) -> str:
    """The noise filter's share as it ran, e.g. `noise_share=0.2`; when `"auto"` estimated the noise rate
    `noise_share=0.38 ("auto": the estimated noise rate 0.38 is used from 0.3, at most 0.5; 0.2 below 0.3)`; for a
    language model `noise_share=0 ("auto": 0.04 of the replies disagree with their prompt neighbours', under 0.1:
    the filter is off; 0.2 from 0.1)`."""
    if params.get("noise_share_applied") is None:
        return f"noise_share={params.get('noise_share')}"
    if params.get("reply_disagreement") is not None:
        reading = params["reply_disagreement"]
        verdict = (f"at least {NOISY_REPLY_SHARE:g}: the filter is on" if params["noise_share_applied"] > 0
                   else f"under {NOISY_REPLY_SHARE:g}: the filter is off")
        return (f"noise_share={params['noise_share_applied']:g} (\"auto\": {reading:g} of the replies disagree with "
                f"their prompt neighbours', {verdict}; {params.get('noise_share'):g} from {NOISY_REPLY_SHARE:g})")
    return (f"noise_share={params['noise_share_applied']:g} (\"auto\": the estimated noise rate "
            f"{params.get('noise_rate_estimate'):g} is used from {NOISY_POOL_RATE:g}, at most {MAX_AUTO_SHARE:g}; "
            f"{params.get('noise_share'):g} below {NOISY_POOL_RATE:g})")


def optimizer_reset(report: dict) -> str | None:
    """`reset_optimizer_state=...` when the run cleared the optimizer's state after its warm-up (the setting, or
    `"auto"` on a pool estimated noisy: `settings.resolve_reset_optimizer_state`), else None."""
    setting = ((report.get("config") or {}).get("strategy_kwargs") or {}).get("reset_optimizer_state", AUTO)
    if not (report.get("warmup_steps") or 0) > 0:
        return None
    try:
        cleared = resolve_reset_optimizer_state(setting, report.get("clustering_params") or {})
    except TypeError:
        return None
    return f"reset_optimizer_state={setting!r}" if cleared else None
