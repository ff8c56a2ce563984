"""Kernel metrics in slime's rollout logging (W&B / TensorBoard).

    --custom-rollout-log-function-path      slime_ext.slime_plugins.rollout_log.log_rollout
    --custom-eval-rollout-log-function-path slime_ext.slime_plugins.rollout_log.log_eval_rollout

slime calls `log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time)` with
the flat samples of a rollout before its default logging, and skips that logging if the function
returns True. This one adds `rollout/kernel/...` metrics (slime_ext.slime_plugins.metrics) and
returns False, so slime's own metrics are still logged: when slime passes a
`rollout_extra_metrics` dict (the rollout function's metrics) the kernel metrics are added to it
and go out in slime's single log call; otherwise they are logged here with slime's `rollout/step`.
`log_eval_rollout(rollout_id, args, data, extra_metrics)` does the same for evaluation data
(`eval/<name>/kernel/...`, step `eval/step`).

Parameter names are slime's own (`slime/observability/rollout_metrics.py` and its plug-in contract
test `tests/plugin_contracts/test_plugin_runtime_hook_contracts.py`, which compares them exactly).
"""

from __future__ import annotations

from typing import Any

from slime_ext.slime_plugins.metrics import kernel_metrics
from slime_ext.slime_plugins.slime_api import log_metrics, rollout_step

__all__ = ["log_eval_rollout", "log_rollout"]


def _emit(args: Any, rollout_id: int, metrics: dict[str, float], extra: Any, step_key: str) -> None:
    if not metrics:
        return
    if isinstance(extra, dict):
        extra.update(metrics)
    else:
        log_metrics(args, {**metrics, step_key: rollout_step(args, rollout_id)}, step_key)


def log_rollout(
    rollout_id: int, args: Any, samples: list[Any], rollout_extra_metrics: Any, rollout_time: float
) -> bool:
    """slime's custom rollout log hook; returns False (slime's default logging still runs)."""
    metrics = kernel_metrics(samples, "rollout/kernel/")
    _emit(args, rollout_id, metrics, rollout_extra_metrics, "rollout/step")
    return False


def log_eval_rollout(rollout_id: int, args: Any, data: dict[str, Any], extra_metrics: Any) -> bool:
    """slime's custom eval log hook; returns False (slime's default eval logging still runs)."""
    metrics: dict[str, float] = {}
    for name, item in data.items():
        metrics |= kernel_metrics(item.get("samples") or [], f"eval/{name}/kernel/")
    _emit(args, rollout_id, metrics, extra_metrics, "eval/step")
    return False
