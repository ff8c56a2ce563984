"""The Prometheus text of the store's counts (`render_prometheus`, of BufferStore.stats()),
served by GET /metrics; the runner's families come from buffer_server/runner.

Separate from the handlers: it is a pure function of the stats dict, tested on its own.
"""

from __future__ import annotations

from typing import Any

from buffer_server.store.rules import DROP_REASONS, DROP_STALE
from krl_common import prometheus as prom

__all__ = ["render_prometheus"]


def render_prometheus(stats: dict[str, Any]) -> str:
    """Prometheus text exposition of BufferStore.stats() (no client library needed)."""
    rec, groups, leases = stats["records"], stats["groups"], stats["leases"]
    outcomes = (
        ("accepted", "total"),
        ("duplicate", "duplicates"),
        ("consumed", "consumed"),
        ("redelivered", "redelivered"),
    )
    return prom.render(
        prom.family(
            "rollout_buffer_records",
            "Records held now, by state.",
            "gauge",
            [({"state": state}, rec[state]) for state in ("ready", "leased")],
        )
        + prom.family(
            "rollout_buffer_groups",
            "Pending groups, by state (ready = can be handed out now).",
            "gauge",
            [({"state": state}, groups[state]) for state in ("ready", "partial")],
        )
        + prom.family(
            "rollout_buffer_records_total",
            "Records by outcome since the database was created.",
            "counter",
            [({"outcome": outcome}, rec[key]) for outcome, key in outcomes],
        )
        + prom.family(
            "rollout_buffer_dropped_records_total",
            "Records dropped by a group rule, by reason.",
            "counter",
            [({"reason": reason}, stats["dropped_records"][reason]) for reason in DROP_REASONS],
        )
        + prom.family(
            "rollout_buffer_dropped_groups_total",
            "Whole groups dropped, by reason.",
            "counter",
            [({"reason": r}, stats["dropped_groups"][r]) for r in DROP_REASONS if r != DROP_STALE],
        )
        + prom.scalars(
            "counter",
            {
                "rollout_buffer_groups_leased_total": (
                    "Groups handed out (redeliveries included).",
                    groups["leased_total"],
                ),
                "rollout_buffer_groups_consumed_total": ("Groups acked by a reader.", groups["consumed"]),
                "rollout_buffer_leases_expired_total": (
                    "Leases that expired without an ack.",
                    leases["expired"],
                ),
                "rollout_buffer_leases_released_total": (
                    "Leases given back by their reader.",
                    leases["released"],
                ),
                "rollout_buffer_write_commits_total": (
                    "Transactions that stored writes (group commit: one may hold several requests), since start.",
                    stats["write_commits"],
                ),
            },
        )
        + prom.scalars(
            "gauge",
            {
                "rollout_buffer_leases_active": ("Leases waiting for an ack.", leases["active"]),
                "rollout_buffer_policy_version": (
                    "Current policy (weights) version.",
                    stats["policy_version"],
                ),
                "rollout_buffer_write_rate": (
                    f"Records accepted per second over the last {stats['write_rate_window_s']:g} s.",
                    stats["writes_per_s_recent"],
                ),
            },
        )
    )
