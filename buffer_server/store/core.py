"""The state and the few primitives that every part of `BufferStore` shares: the transaction,
the counters, the wake-up of waiting readers, the deletion of records and of unused body
segments.

The store is one class composed of parts, one per concern (writes.py, groups.py, leases.py,
preparer.py, and buffer_store.py, which builds it). Each part subclasses `StoreCore`: the state
the parts share is listed here, a part's own state in its class, and `BufferStore.__init__`
creates all of it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from buffer_server.store.bodylog import BodyLog
from buffer_server.store.jsoncache import JsonCache
from buffer_server.store.rules import GroupRules

__all__ = ["WAIT_POLL_S", "StoreCore"]

# How often a waiting lease re-checks time-based rules (group timeouts, lease expiry) when no
# write wakes it earlier.
WAIT_POLL_S = 0.25


class StoreCore:
    """Shared state (annotations only: `BufferStore.__init__` sets it) and shared primitives."""

    path: Path
    rules: GroupRules
    _clock: Callable[[], float]  # unix seconds: stored_at, group timeouts, lease expiry
    _conn: sqlite3.Connection
    _db_lock: threading.Lock  # held by every use of _conn
    _bodies: BodyLog
    _policy_version: int
    # Waiting readers (a lease, the JSON preparer) sleep on _wake until _write_gen moves.
    _wake: threading.Condition
    _write_gen: int
    _deleted_gen: int  # moved by every deletion of records (the JSON preparer's purge reads it)
    _cache: JsonCache  # prepared reply JSON by record seq (preparer.py)
    _json_readers: threading.Event  # set by the first JSON lease
    # Held from a group commit's body append to its commit, and by segment collection.
    _append_lock: threading.Lock

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """BEGIN IMMEDIATE ... COMMIT under the store lock; ROLLBACK on any exception."""
        with self._db_lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.rollback()
                raise

    @staticmethod
    def _bump(cur: sqlite3.Cursor, name: str, n: int = 1) -> None:
        if n:
            cur.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                (name, n),
            )

    def _stale_floor(self) -> int | None:
        k = self.rules.max_staleness
        return None if k is None else self._policy_version - k

    def _notify(self) -> None:
        with self._wake:
            self._write_gen += 1
            self._wake.notify_all()

    def _delete(self, cur: sqlite3.Cursor, where: str, params: tuple[Any, ...]) -> dict[str, int]:
        """Delete the records matching `where` (rows and bodies); returns counts per instance_id."""
        per_instance = dict(
            cur.execute(
                f"SELECT instance_id, COUNT(*) FROM records WHERE {where} GROUP BY instance_id", params
            )
        )
        if per_instance:
            self._deleted_gen += 1
            self._cache.discard(
                seq for (seq,) in cur.execute(f"DELETE FROM records WHERE {where} RETURNING seq", params)
            )
        return per_instance

    def _count_instances(self, cur: sqlite3.Cursor, column: str, per_instance: dict[str, int]) -> None:
        cur.executemany(
            f"UPDATE instances SET {column} = {column} + ? WHERE instance_id = ?",
            [(n, iid) for iid, n in per_instance.items()],
        )

    def collect_segments(self) -> list[int]:
        """Delete the body segments that no stored record points into (after acks and drops);
        returns their ids. Runs after every ack, at open and with `stats`."""
        with self._append_lock:  # no body is between its append and its row's commit
            with self._db_lock:
                # One index probe per segment file (a handful), not a scan of every row.
                dead = [
                    segment
                    for segment in self._bodies.segments()
                    if self._conn.execute(
                        "SELECT 1 FROM records WHERE segment = ? LIMIT 1", (segment,)
                    ).fetchone()
                    is None
                ]
            return self._bodies.remove(dead)
