"""TEST DOUBLE of slime/observability/logging_utils.log: slime sends the dict to W&B and/or
TensorBoard (step taken from `metrics[step_key]`); the double appends `(metrics, step_key)` to
LOGGED so tests can read what would have been logged."""

from __future__ import annotations

from typing import Any

LOGGED: list[tuple[dict[str, Any], str]] = []


def log(args, metrics, step_key: str):
    if step_key not in metrics:
        raise KeyError(f"step key {step_key!r} missing from the logged metrics")
    LOGGED.append((dict(metrics), step_key))
