"""Hand-out of whole groups under two-phase leases: `lease` takes eligible groups and marks
them leased in the transaction that selects them, `ack` consumes them, `release` (or expiry,
in groups.py) puts them back.

Separate from the rules (groups.py), which decide which groups may go out, and from the JSON
preparer (preparer.py), which fills the cache that `lease` pops its replies from.
"""

from __future__ import annotations

import time
import uuid

from buffer_server.store.core import WAIT_POLL_S
from buffer_server.store.groups import GroupMaintenance
from buffer_server.store.results import AckResult, Lease, LeasedGroup, LeaseError
from krl_common import fastjson
from slime_ext.trajectory import codec
from slime_ext.trajectory.record import TrajectoryRecord

__all__ = ["Leases", "encode_record"]


def encode_record(record: TrajectoryRecord) -> bytes:
    """The served form of a record: compact UTF-8 JSON of `to_json()` (what `lease` returns;
    the stored form is `codec.encode`, which gives these bytes back with `codec.to_json`)."""
    return fastjson.dumps(record.to_json())


class Leases(GroupMaintenance):
    """lease / ack / release; each applies the due rules (`_maintain`) first."""

    def lease(
        self,
        max_groups: int,
        *,
        timeout_s: float = 0.0,
        lease_s: float | None = None,
        policy_version: int | None = None,
        packed: bool = False,
    ) -> Lease:
        """Hand out up to `max_groups` whole eligible groups under one new lease.

        Waits up to `timeout_s` for `max_groups` groups, taking each group as soon as it is
        eligible; returns whatever it holds at the deadline (possibly nothing, lease_id None).
        `policy_version`, if given, is applied first like `set_policy_version`. The groups must
        be acked (`ack`) within `lease_s` seconds (default `rules.lease_s`) of the return, or
        they are handed out again. The records come as their JSON, or (`packed`) as their packed
        bodies (slime_ext/trajectory/codec.py) exactly as stored.
        """
        if max_groups < 1:
            raise ValueError("max_groups: must be >= 1")
        lease_s = self.rules.lease_s if lease_s is None else lease_s
        if lease_s <= 0:
            raise ValueError("lease_s: must be > 0")
        if policy_version is not None:
            self.set_policy_version(policy_version)
        start = time.monotonic()
        deadline = start + max(0.0, timeout_s)
        lease_id: str | None = None
        held = 0
        # One group per instance per lease: the reply is keyed by instance, so a second group of
        # an instance that became eligible while the lease waited (the agent runner starts the
        # next epoch's group once the first left `ready`) would reach the reader merged with the
        # first, as one group of twice the size (a GPU run consumed 3 groups in one step that
        # way, and its last step waited for data the runner never made). It waits for a later lease.
        held_instances: set[str] = set()
        rows: list[tuple[int, str, int, int, int]] = []
        expires_at: float | None = None
        while True:
            with self._wake:
                gen = self._write_gen
            with self._transaction() as cur:
                now = self._clock()
                self._maintain(cur, now)
                take = self._eligible(cur, now, max_groups - held, exclude=held_instances)
                if take:
                    if lease_id is None:
                        lease_id = uuid.uuid4().hex
                        # Held while waiting: expiry only counts from the return (set below).
                        cur.execute(
                            "INSERT INTO leases (lease_id, created_at, expires_at, state, groups, records) "
                            "VALUES (?, ?, ?, 'active', 0, 0)",
                            (lease_id, now, now + (deadline - time.monotonic()) + lease_s),
                        )
                    for instance_id, _size in take:
                        # The whole group leaves `ready`: its row goes first, which spares the
                        # state trigger a recount per record (see schema.py).
                        cur.execute("DELETE FROM ready_groups WHERE instance_id = ?", (instance_id,))
                        cur.execute(
                            "UPDATE records SET state = 'leased', lease_id = ? "
                            "WHERE state = 'ready' AND instance_id = ?",
                            (lease_id, instance_id),
                        )
                        cur.execute(
                            "UPDATE leases SET groups = groups + 1, records = records + ? WHERE lease_id = ?",
                            (cur.rowcount, lease_id),
                        )
                    held += len(take)
                    held_instances.update(instance_id for instance_id, _size in take)
                    self._bump(cur, "groups_leased", len(take))
                remaining = deadline - time.monotonic()
                done = held >= max_groups or remaining <= 0
                if done and lease_id is not None:  # in the same transaction: one commit in all
                    expires_at = now + lease_s
                    cur.execute("UPDATE leases SET expires_at = ? WHERE lease_id = ?", (expires_at, lease_id))
                    rows = cur.execute(
                        "SELECT seq, instance_id, segment, offset, length FROM records "
                        "WHERE lease_id = ? AND state = 'leased' ORDER BY seq",
                        (lease_id,),
                    ).fetchall()
            if done:
                break
            with self._wake:
                if self._write_gen == gen:
                    self._wake.wait(min(remaining, WAIT_POLL_S))
        waited = time.monotonic() - start
        if lease_id is None:
            return Lease(None, [], None, self._policy_version, waited)
        # Read and unpacked outside the store lock (writers go on meanwhile): leased rows are
        # deleted only by this lease's ack, which the caller cannot send before this returns.
        by_instance: dict[str, list[bytes]] = {}
        if packed:
            self._cache.discard(seq for seq, *_ in rows)  # JSON prepared before, not needed now
        else:
            self._json_readers.set()
        for seq, instance_id, segment, offset, length in rows:
            if packed:
                data = self._bodies.read(segment, offset, length)
            elif (data := self._cache.pop(seq)) is None:
                data = codec.to_json(self._bodies.read(segment, offset, length))
            by_instance.setdefault(instance_id, []).append(data)
        groups = [LeasedGroup(iid, bodies) for iid, bodies in by_instance.items()]
        return Lease(lease_id, groups, expires_at, self._policy_version, waited)

    def ack(self, lease_id: str) -> AckResult:
        """The reader has the lease's groups: mark them consumed. A retried ack is answered again."""
        with self._transaction() as cur:
            self._maintain(cur, self._clock())
            row = cur.execute(
                "SELECT state, groups, records FROM leases WHERE lease_id = ?", (lease_id,)
            ).fetchone()
            if row is None:
                raise LeaseError(f"lease_id: unknown lease {lease_id!r}", 404)
            state, groups, records = row
            if state == "acked":
                return AckResult(lease_id, groups, records, already=True)
            if state != "active":
                raise LeaseError(
                    f"lease_id: lease {lease_id!r} was {state} before this ack; its groups went back to "
                    "the buffer and may have been handed out again",
                    409,
                )
            # Pruned at once: the uids stay in `uids`, the totals in `instances` and `counters`.
            per_instance = self._delete(cur, "lease_id = ? AND state = 'leased'", (lease_id,))
            self._count_instances(cur, "consumed", per_instance)
            cur.executemany(
                "UPDATE instances SET groups_consumed = groups_consumed + 1 WHERE instance_id = ?",
                [(iid,) for iid in per_instance],
            )
            cur.execute("UPDATE leases SET state = 'acked' WHERE lease_id = ?", (lease_id,))
            self._bump(cur, "groups_consumed", groups)
            self._bump(cur, "records_consumed", records)
        self.collect_segments()
        return AckResult(lease_id, groups, records, already=False)

    def release(self, lease_id: str) -> int:
        """Give a lease's groups back to the buffer now (instead of waiting for expiry).

        Returns the records made ready again; releasing a released or expired lease returns 0."""
        with self._transaction() as cur:
            self._maintain(cur, self._clock())
            row = cur.execute("SELECT state FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
            if row is None:
                raise LeaseError(f"lease_id: unknown lease {lease_id!r}", 404)
            if row[0] == "acked":
                raise LeaseError(f"lease_id: lease {lease_id!r} was already acked (consumed)", 409)
            if row[0] != "active":
                return 0
            cur.execute(
                "UPDATE records SET state = 'ready', lease_id = NULL WHERE lease_id = ? AND state = 'leased'",
                (lease_id,),
            )
            released = cur.rowcount
            cur.execute("UPDATE leases SET state = 'released' WHERE lease_id = ?", (lease_id,))
            self._bump(cur, "leases_released")
        self._notify()
        return released
