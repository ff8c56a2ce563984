"""The group rules as settings: `GroupRules` (when a group is handed out or dropped) and the
names of the drop reasons that the counters, /stats and /metrics report.

Separate from the SQL that applies them (groups.py) because the CLI, the HTTP layer and the
metrics need the settings and the reason names, not the store.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DROP_GROUP_TIMEOUT", "DROP_REASONS", "DROP_STALE", "DROP_ZERO_VARIANCE", "GroupRules"]

DROP_STALE = "stale"
DROP_ZERO_VARIANCE = "zero_variance"
DROP_GROUP_TIMEOUT = "group_timeout"
DROP_REASONS: tuple[str, ...] = (DROP_STALE, DROP_ZERO_VARIANCE, DROP_GROUP_TIMEOUT)


@dataclass(frozen=True)
class GroupRules:
    """When a group is handed out or dropped. Every field is a CLI flag of the server."""

    group_size: int = 8  # records per instance that make a group complete
    # A partial group that times out is handed out if it holds at least this many records
    # (None: min(2, group_size), the fewest that can have a reward spread).
    min_group_size: int | None = None
    group_timeout_s: float | None = 600.0  # partial groups older than this: hand out or drop; None = never
    drop_zero_variance: bool = True  # drop eligible groups whose rewards are all equal
    max_staleness: int | None = 1  # drop records with policy_version < current - K; None = keep all
    lease_s: float = 300.0  # how long a reader has to ack a batch before it is handed out again

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError("group_size: must be >= 1")
        if self.min_group_size is None:
            object.__setattr__(self, "min_group_size", min(2, self.group_size))
        if not 1 <= self.min_group_size <= self.group_size:
            raise ValueError(f"min_group_size: must be in [1, group_size={self.group_size}]")
        if self.group_timeout_s is not None and self.group_timeout_s <= 0:
            raise ValueError("group_timeout_s: must be > 0 (or None for never)")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("max_staleness: must be >= 0 (or None for no limit)")
        if self.lease_s <= 0:
            raise ValueError("lease_s: must be > 0")
