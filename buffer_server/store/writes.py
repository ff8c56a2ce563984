"""The write path of the store: `put` / `put_encoded` with group commit, and the insert of a
put's rows (uids, records, ready_groups, instances, counters) in the commit's transaction.

Separate because durability lives here and nowhere else: bodies appended and fdatasynced
(bodylog.py) before the rows that point at them commit, concurrent puts sharing one commit,
and a failed group commit retried put by put.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from buffer_server.store.core import StoreCore
from buffer_server.store.results import PutResult
from buffer_server.store.rules import DROP_STALE
from slime_ext.trajectory import codec
from slime_ext.trajectory.codec import EncodedRecord
from slime_ext.trajectory.record import TrajectoryRecord

__all__ = ["WritePath"]

log = logging.getLogger("buffer_server.store.buffer_store")  # the store's one logger


@dataclass
class _PendingPut:
    """One put waiting for (or inside) a group commit."""

    rows: list[EncodedRecord]
    locations: list[tuple[int, int]] | None = None  # (segment, offset) of each body, once written
    result: PutResult | None = None
    error: BaseException | None = None
    done: bool = False


class WritePath(StoreCore):
    """Durable, idempotent, all-or-nothing writes (see buffer_store.py's docstring)."""

    # Set by BufferStore.__init__: the group-commit queue and the recent write rate.
    _put_cond: threading.Condition
    _put_queue: list[_PendingPut]
    _put_leading: bool
    _write_commits: int  # transactions that stored puts, since this process started
    _recent_writes: collections.deque[tuple[float, int]]  # (monotonic time, records accepted)
    _rate_lock: threading.Lock

    def put(self, records: Sequence[TrajectoryRecord]) -> PutResult:
        """Store records durably (all or none); idempotent by uid. Returns once committed.

        Group commit: puts that arrive while another put is committing wait, and the next one
        to lead commits all of them in one transaction (one fsync); if that transaction fails,
        each put is retried alone, so a put fails only for its own records. Records are trusted
        to be valid: build them with `parse_record` (the HTTP app does).
        """
        return self.put_encoded([codec.encode(r) for r in records])

    def put_encoded(self, records: Sequence[EncodedRecord]) -> PutResult:
        """`put` for records already packed (by `codec.encode` or the HTTP fast path `ingest`)."""
        item = _PendingPut(list(records))
        with self._put_cond:
            self._put_queue.append(item)
            while not item.done and self._put_leading:
                self._put_cond.wait()
            if not item.done:  # lead: commit everything queued so far, this put included
                self._put_leading = True
                batch, self._put_queue = self._put_queue, []
        if not item.done:
            try:
                self._commit_puts(batch)
            finally:
                with self._put_cond:
                    self._put_leading = False
                    self._put_cond.notify_all()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _commit_puts(self, batch: list[_PendingPut]) -> None:
        try:
            try:
                with self._append_lock:
                    unwritten = [item for item in batch if item.locations is None]
                    # Bodies first, fdatasynced; then the rows that point at them (bodylog.py).
                    locations = self._bodies.append([row.body for item in unwritten for row in item.rows])
                    for item in unwritten:
                        item.locations, locations = locations[: len(item.rows)], locations[len(item.rows) :]
                    with self._transaction() as cur:
                        results = [self._insert(cur, item) for item in batch]
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].error = exc
                    return
                log.warning("a group commit of %d puts failed (%s): retrying each alone", len(batch), exc)
                for item in batch:
                    self._commit_puts([item])
                return
            for item, result in zip(batch, results, strict=True):
                item.result = result
            self._write_commits += 1
            accepted = sum(r.accepted for r in results)
            if accepted:
                with self._rate_lock:
                    self._recent_writes.append((time.monotonic(), accepted))
                self._notify()
        finally:
            for item in batch:
                if item.result is None and item.error is None:  # only on BaseException
                    item.error = RuntimeError("the commit of this write was interrupted; nothing was stored")
                item.done = True

    def _insert(self, cur: sqlite3.Cursor, item: _PendingPut) -> PutResult:
        rows, locations = item.rows, item.locations
        assert locations is not None
        now = self._clock()
        floor = self._stale_floor()
        accepted = stale = 0
        per_instance: dict[str, list[int]] = {}  # instance_id -> [accepted, dropped]
        ready: dict[str, list[Any]] = {}  # instance_id -> its ready_groups values from this put
        for row, (segment, offset) in zip(rows, locations, strict=True):
            # Only a uid conflict is ignored (INSERT OR IGNORE would also silently skip a row
            # that fails a CHECK constraint and count it as a duplicate).
            cur.execute("INSERT INTO uids (uid) VALUES (?) ON CONFLICT (uid) DO NOTHING", (row.uid,))
            if cur.rowcount != 1:
                continue
            accepted += 1
            counts = per_instance.setdefault(row.instance_id, [0, 0])
            counts[0] += 1
            if floor is not None and row.policy_version < floor:
                stale += 1  # dropped on arrival: only its uid is kept
                counts[1] += 1
                continue
            cur.execute(
                "INSERT INTO records "
                "(uid, instance_id, policy_version, reward, stored_at, state, segment, offset, length) "
                "VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
                (
                    row.uid,
                    row.instance_id,
                    row.policy_version,
                    row.reward,
                    now,
                    segment,
                    offset,
                    len(row.body),
                ),
            )
            group = ready.get(row.instance_id)
            if group is None:
                ready[row.instance_id] = [1, cur.lastrowid, now, row.reward, row.reward, row.policy_version]
            else:
                group[0] += 1
                group[3], group[4] = min(group[3], row.reward), max(group[4], row.reward)
                group[5] = min(group[5], row.policy_version)
        cur.executemany(
            "INSERT INTO ready_groups (instance_id, size, first_seq, oldest, lo, hi, min_version) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (instance_id) DO UPDATE SET "
            "size = size + excluded.size, first_seq = min(first_seq, excluded.first_seq), "
            "oldest = min(oldest, excluded.oldest), lo = min(lo, excluded.lo), hi = max(hi, excluded.hi), "
            "min_version = min(min_version, excluded.min_version)",
            [(iid, *values) for iid, values in ready.items()],
        )
        cur.executemany(
            "INSERT INTO instances (instance_id, accepted, dropped) VALUES (?, ?, ?) "
            "ON CONFLICT (instance_id) DO UPDATE SET accepted = accepted + excluded.accepted, "
            "dropped = dropped + excluded.dropped",
            [(iid, a, d) for iid, (a, d) in per_instance.items()],
        )
        duplicates = len(rows) - accepted
        self._bump(cur, "records_accepted", accepted)
        self._bump(cur, "records_duplicate", duplicates)
        self._bump(cur, f"dropped_records.{DROP_STALE}", stale)
        return PutResult(accepted=accepted, duplicates=duplicates, stale=stale)
