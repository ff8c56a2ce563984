"""The group rules applied in SQL: the policy version and the stale records it drops, the
zero-variance and group-timeout drops, lease expiry, and which pending groups are eligible for
hand-out (one `ready_groups` row per group, see schema.py).

Separate from the hand-out (leases.py) and the stats, which call `_maintain` first in their
transactions: here is every decision about when a group goes out or is dropped (a write only
reads the stale floor, `StoreCore._stale_floor`).
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Collection
from typing import Any

from buffer_server.store.core import StoreCore
from buffer_server.store.results import PolicyVersionError
from buffer_server.store.rules import DROP_GROUP_TIMEOUT, DROP_STALE, DROP_ZERO_VARIANCE

__all__ = ["GroupMaintenance"]

log = logging.getLogger("buffer_server.store.buffer_store")  # the store's one logger

# A pending group (a ready_groups row) that may be handed out; parameters from _group_params.
_ELIGIBLE = "size >= :size OR (oldest <= :cutoff AND size >= :min_size)"


class GroupMaintenance(StoreCore):
    """The rules of GroupRules over the ready_groups rows, inside the caller's transaction."""

    def set_policy_version(self, version: int) -> int:
        """Move the current policy version forward (same version: no-op); returns records dropped as stale."""
        old = self._policy_version
        try:
            with self._transaction() as cur:
                if version < self._policy_version:
                    raise PolicyVersionError(
                        f"version: {version} < current {self._policy_version} "
                        "(policy versions only move forward)"
                    )
                cur.execute("UPDATE meta SET value = ? WHERE key = 'policy_version'", (version,))
                self._policy_version = version  # under the store lock: the next put sees it
                dropped = self._drop_stale(cur)
        except BaseException:
            self._policy_version = old
            raise
        if dropped:
            self.collect_segments()
            self._notify()
        return dropped

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def pending_groups(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Apply the group rules now; return (ready, partial) groups as (instance_id, records).

        Ready groups are eligible for hand-out (the agent runner's backpressure counts them)."""
        with self._transaction() as cur:
            return self._pending(cur)

    def _pending(self, cur: sqlite3.Cursor) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        now = self._clock()
        self._maintain(cur, now)
        return self._eligible(cur, now), self._partial(cur, now)

    def _drop_stale(self, cur: sqlite3.Cursor) -> int:
        floor = self._stale_floor()
        if floor is None:
            return 0
        if (
            cur.execute("SELECT 1 FROM ready_groups WHERE min_version < ? LIMIT 1", (floor,)).fetchone()
            is None
        ):
            return 0  # nothing stale: no scan of the ready records
        per_instance = self._delete(cur, "state = 'ready' AND policy_version < ?", (floor,))
        self._count_instances(cur, "dropped", per_instance)
        dropped = sum(per_instance.values())
        self._bump(cur, f"dropped_records.{DROP_STALE}", dropped)
        return dropped

    def _drop_group(self, cur: sqlite3.Cursor, instance_id: str, reason: str) -> None:
        per_instance = self._delete(cur, "state = 'ready' AND instance_id = ?", (instance_id,))
        self._count_instances(cur, "dropped", per_instance)
        self._bump(cur, f"dropped_records.{reason}", sum(per_instance.values()))
        self._bump(cur, f"dropped_groups.{reason}")

    def _maintain(self, cur: sqlite3.Cursor, now: float) -> None:
        """Apply every rule that is due: expired leases, stale records, zero-variance groups,
        partial groups timed out with too few records. Reads ready_groups through its indexes:
        the cost follows what is due, not what is stored."""
        expired = cur.execute(
            "SELECT lease_id FROM leases WHERE state = 'active' AND expires_at < ?", (now,)
        ).fetchall()
        for (lease_id,) in expired:
            cur.execute(
                "UPDATE records SET state = 'ready', lease_id = NULL WHERE lease_id = ? AND state = 'leased'",
                (lease_id,),
            )
            self._bump(cur, "records_redelivered", cur.rowcount)
            cur.execute("UPDATE leases SET state = 'expired' WHERE lease_id = ?", (lease_id,))
            self._bump(cur, "leases_expired")
            log.warning("lease %s expired without an ack: its groups are ready again", lease_id)
        self._drop_stale(cur)
        rules, params = self.rules, self._group_params(now)
        if rules.drop_zero_variance:
            flat = cur.execute(
                f"SELECT instance_id FROM ready_groups WHERE lo = hi AND ({_ELIGIBLE})", params
            ).fetchall()
            for (instance_id,) in flat:
                self._drop_group(cur, instance_id, DROP_ZERO_VARIANCE)
        if rules.group_timeout_s is not None:
            late = cur.execute(
                "SELECT instance_id FROM ready_groups WHERE oldest <= :cutoff AND size < :min_size", params
            ).fetchall()
            for (instance_id,) in late:
                self._drop_group(cur, instance_id, DROP_GROUP_TIMEOUT)

    def _group_params(self, now: float) -> dict[str, Any]:
        rules = self.rules
        timeout = rules.group_timeout_s
        return {
            "size": rules.group_size,
            "min_size": rules.min_group_size,
            "cutoff": -math.inf if timeout is None else now - timeout,
        }

    def _eligible(
        self, cur: sqlite3.Cursor, now: float, limit: int | None = None, exclude: Collection[str] = ()
    ) -> list[tuple[str, int]]:
        """Eligible groups as (instance_id, size), oldest first (by their first record's
        arrival), at most `limit`, none of the instances in `exclude`; call after `_maintain`
        (which dropped the flat ones)."""
        rows = cur.execute(
            f"SELECT instance_id, size FROM ready_groups WHERE {_ELIGIBLE} ORDER BY first_seq LIMIT :limit",
            {**self._group_params(now), "limit": -1 if limit is None else limit + len(exclude)},
        ).fetchall()
        rows = [row for row in rows if row[0] not in exclude]
        return rows if limit is None else rows[:limit]

    def _partial(self, cur: sqlite3.Cursor, now: float) -> list[tuple[str, int]]:
        """Groups still waiting for records, as (instance_id, size)."""
        return cur.execute(
            f"SELECT instance_id, size FROM ready_groups WHERE NOT ({_ELIGIBLE})", self._group_params(now)
        ).fetchall()
