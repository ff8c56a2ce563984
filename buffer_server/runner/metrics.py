"""What the agent runner reports: its counters, latency windows and abort categories (the
`runner` section of GET /stats) and their Prometheus text (`rollout_runner_*` in /metrics).

Kept apart from `agent_runner.py` so the runner's loop reads as scheduling and episodes only,
and so the HTTP app renders /metrics without reaching into the loop's module.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from krl_common import prometheus as prom
from krl_common.stats import percentile

__all__ = [
    "ENGINE_ABORTS",
    "LATENCY_WINDOW",
    "LatencyWindow",
    "RunnerCounters",
    "abort_category",
    "outage_summary",
    "runner_prometheus",
]

LATENCY_WINDOW = 1024  # turns / episodes kept for the latency percentiles in /stats
ENGINE_ABORTS = frozenset({"engine_abort", "generate_error"})  # abort categories of the engine


def abort_category(reason: str) -> str:
    """A short key for an abort reason (the /stats counters); the full text is logged."""
    if reason.startswith("evaluation failed"):
        return "eval_unavailable"
    if reason.startswith("evaluator-side"):
        return "eval_server_status"
    if reason.startswith("generation aborted"):
        return "engine_abort"
    if reason.startswith("generate error"):
        return "generate_error"
    return "error"


def outage_summary(
    consecutive_aborts: int, since: float | None, category: str | None, now: float
) -> dict[str, Any]:
    """The current streak of aborted episodes (no episode completed since its first abort, at
    monotonic time `since`), so a console (the dry run) can say that the engine or eval server
    has been down for N s instead of the run going quiet. `service`: engine | eval | other, from
    the last abort's category."""
    category = category or ""
    service = "eval" if category.startswith("eval") else "engine" if category in ENGINE_ABORTS else "other"
    return {
        "consecutive_aborts": consecutive_aborts,
        "failing_s": round(now - since, 1) if since is not None else 0.0,
        "service": service if since is not None else None,
    }


class LatencyWindow:
    """The last `size` durations of one kind (generate turn, eval turn, episode), in seconds."""

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._values: collections.deque[float] = collections.deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def extend(self, seconds: Iterable[float]) -> None:
        self._values.extend(seconds)

    def summary(self) -> dict[str, Any]:
        """count, p50_s, p90_s, max_s, mean_s (None while empty) for /stats."""
        xs = list(self._values)
        return {
            "count": len(xs),
            "p50_s": percentile(xs, 0.5),
            "p90_s": percentile(xs, 0.9),
            "max_s": max(xs) if xs else None,
            "mean_s": round(sum(xs) / len(xs), 4) if xs else None,
        }


@dataclass
class RunnerCounters:
    """The runner's counters since it was created (GET /stats, /metrics)."""

    episodes_started: int = 0
    episodes_completed: int = 0  # finished and not aborted (completed or truncated)
    episodes_truncated: int = 0
    episodes_aborted: int = 0
    episodes_retried: int = 0
    episodes_given_up: int = 0
    episodes_cancelled: int = 0  # cut off by a stop that timed out
    groups_scheduled: int = 0
    groups_written: int = 0
    groups_short: int = 0  # written with fewer episodes than group_size (given-up samples)
    groups_discarded: int = 0  # unfinished at an on-policy stop (max_staleness 0): not written
    records_written: int = 0
    records_duplicate: int = 0
    write_errors: int = 0
    records_lost: int = 0  # records whose write failed WRITE_ATTEMPTS times (their episodes rerun next start)
    backpressure_waits: int = 0
    curriculum_advances: int = 0
    aborts_by_reason: dict[str, int] = field(default_factory=dict)


def runner_prometheus(stats: dict[str, Any]) -> str:
    """Prometheus text of AgentRunner.stats() (`rollout_runner_*`), appended to the buffer's /metrics."""
    ep, groups, cur = stats["episodes"], stats["groups"], stats["curriculum"]
    outcomes = ("started", "completed", "truncated", "aborted", "retried", "given_up", "cancelled")
    return prom.render(
        prom.family(
            "rollout_runner_episodes_total",
            "Agent-runner episodes by outcome since the runner was created.",
            "counter",
            [({"outcome": o}, ep[o]) for o in outcomes],
        )
        + prom.family(
            "rollout_runner_aborts_total",
            "Aborted episodes by reason.",
            "counter",
            [({"reason": r}, n) for r, n in sorted(stats["aborts_by_reason"].items())],
        )
        + prom.scalars(
            "counter",
            {
                "rollout_runner_groups_written_total": ("Groups written to the store.", groups["written"]),
                "rollout_runner_backpressure_waits_total": (
                    "Times the runner waited because max_ready_groups groups were ready.",
                    stats["backpressure"]["waits"],
                ),
            },
        )
        + prom.scalars(
            "gauge",
            {
                "rollout_runner_running": ("1 while the runner loop runs.", int(stats["running"])),
                "rollout_runner_episodes_in_flight": ("Episodes holding a slot.", ep["in_flight"]),
                "rollout_runner_epoch": ("Lowest epoch still being handed out.", stats["epoch"] or 0),
                "rollout_runner_curriculum_tier": ("Curriculum tier (0 = first level).", cur.get("tier", 0)),
            },
        )
    )
