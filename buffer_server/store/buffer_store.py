"""Durable trajectory store with GRPO group hand-out: small rows in one SQLite file in WAL
mode, packed record bodies (slime_ext/trajectory/codec.py) in append-only segment files beside
it (bodylog.py).

Durability. A `put` appends its bodies to the body log and fdatasyncs them, then commits their
rows in one transaction with `synchronous=FULL`, and only then returns, so an acknowledged
record survives kill -9 of the server and a power loss of the machine. Concurrent puts share
one append, one fdatasync and one commit (group commit). Writes are idempotent by `uid`: the
first write of a uid wins, a retry is reported as a duplicate and stores nothing (its content is
not compared). The uid insert is `ON CONFLICT (uid) DO NOTHING`, which, unlike INSERT OR IGNORE,
still fails on any other constraint. All records of one `put` are stored or none is.

Pruning. A record's row is deleted when it is consumed (acked) or dropped; its uid stays in the
`uids` table, so even a very late retry is still a duplicate, and per-instance totals stay in
`instances` (`instance_counts`). A body segment is deleted once no row points into it
(`collect_segments`).

Groups. Records are grouped by `instance_id`. The "pending group" of an instance is its records
in state `ready`; it is handed out when it is *eligible*:
- it holds >= `group_size` records (records are counted, not distinct trajectories), or
- its oldest record is older than `group_timeout_s` and it holds >= `min_group_size` records
  (a partial group that times out with fewer is dropped: reason `group_timeout`);
- an eligible group whose rewards are all equal is dropped when `drop_zero_variance` is on
  (reason `zero_variance`: it carries no GRPO advantage);
- a record whose `policy_version` is below `current_policy_version - max_staleness` is dropped
  on arrival or when the version moves (reason `stale`), whichever comes first.
A group is handed out whole: every ready record of the instance at that moment, including any
beyond `group_size`. Records that arrive for the instance later form its next group.

Delivery: two-phase lease. `lease` marks the groups `leased` under a new lease id in the same
transaction that selects them, so no other reader can get them; `ack(lease_id)` consumes them
(deletes their rows); `release(lease_id)` or the lease expiring (`lease_s`,
checked against the wall clock, so it survives restarts) puts them back to `ready` for the next
reader. So a group is consumed exactly once, and it is delivered again only if its lease was
released or expired without an ack (the reader crashed, or the HTTP reply was lost).

Every drop, expiry and hand-out is counted in a `counters` table, updated in the same
transaction as the change, so the counts survive restarts. One process owns a database at a
time (an exclusive lock on `PATH.lock`), because waiting readers are woken in-process.

Where the code is: this module opens, closes and reports; the schema and its migration are in
schema.py, the settings of the rules in rules.py and their SQL in groups.py, the write path in
writes.py, the hand-out in leases.py, the JSON preparer in preparer.py, the shared transaction
in core.py, and what the API returns and raises in results.py.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from buffer_server.store import schema
from buffer_server.store.bodylog import DEFAULT_SEGMENT_BYTES, BodyLog
from buffer_server.store.jsoncache import JsonCache
from buffer_server.store.leases import Leases
from buffer_server.store.preparer import DEFAULT_JSON_CACHE_BYTES, JsonPreparer
from buffer_server.store.results import InstanceCounts, StoreError
from buffer_server.store.rules import DROP_REASONS, DROP_STALE, GroupRules
from buffer_server.store.writes import WritePath
from krl_common import fastjson

__all__ = ["BufferStore", "WRITE_RATE_WINDOW_S"]

WRITE_RATE_WINDOW_S = 10.0


class BufferStore(WritePath, Leases, JsonPreparer):
    """Thread-safe: one SQLite connection, every transaction under one lock.

    Composed of its parts: writes (writes.py), the rules and the policy version (groups.py),
    lease / ack / release (leases.py), the JSON preparer (preparer.py), the shared transaction
    and state (core.py). This class opens and closes the store and answers the read-only
    queries (uids, per-instance totals, meta, stats).

    `clock` (unix seconds) is used for stored_at, group timeouts and lease expiry; tests pass a
    fake one.
    """

    def __init__(
        self,
        path: str | Path,
        rules: GroupRules | None = None,
        *,
        clock: Callable[[], float] = time.time,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        json_cache_bytes: int = DEFAULT_JSON_CACHE_BYTES,
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        self.rules = rules or GroupRules()
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(f"{self.path}.lock", "a+b")  # noqa: SIM115 - held for the store's life
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreError(
                f"{self.path} is in use by another buffer server (lock {self.path}.lock is held)"
            ) from None
        self._db_lock = threading.Lock()
        self._wake = threading.Condition()
        self._write_gen = 0
        # deletions seen / handled by the JSON preparer's purge (no purge while nothing was deleted)
        self._deleted_gen = self._purged_gen = 0
        self._recent_writes = collections.deque()
        self._rate_lock = threading.Lock()
        self._put_cond = threading.Condition()
        self._put_queue = []
        self._put_leading = False
        self._write_commits = 0  # transactions that stored puts, since this process started
        # Held from a group commit's body append to its commit, and by segment collection, so a
        # segment is never deleted between a body's write and the commit of its row.
        self._append_lock = threading.Lock()
        self._cache = JsonCache(json_cache_bytes)
        # Set by the first JSON lease: until a reader wants JSON, preparing it is wasted CPU
        # (the trainer's client reads packed batches).
        self._json_readers = threading.Event()
        self._closing = False
        self._preparer = None
        try:
            self._conn = sqlite3.connect(
                str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False
            )
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL journal mode (got {mode!r})")
            self._conn.execute("PRAGMA synchronous=FULL")
            # Deleted rows are not zero-filled (this build defaults to secure_delete=ON).
            self._conn.execute("PRAGMA secure_delete=FAST")
            schema.check_version(self._conn, self.path)
            self._conn.executescript(schema.SCHEMA)
            with self._transaction() as cur:
                self._policy_version = schema.stamp_or_migrate(cur, self.path)
            self._bodies = BodyLog(Path(f"{self.path}.bodies"), segment_bytes)
            self.collect_segments()  # leftovers of a crash between a body append and its commit
        except BaseException:
            self.close()
            raise
        if json_cache_bytes > 0:
            self._preparer = threading.Thread(
                target=self._prepare_loop, name="buffer-json-preparer", daemon=True
            )
            self._preparer.start()

    def close(self) -> None:
        """Close after the transaction in progress, if any, has finished (waits up to 10 s)."""
        self._closing = True
        preparer = getattr(self, "_preparer", None)
        if preparer is not None:
            self._notify()
            preparer.join(timeout=10.0)
        lock = getattr(self, "_db_lock", None)
        got = lock.acquire(timeout=10.0) if lock is not None else False
        try:
            with contextlib.suppress(Exception):
                self._conn.close()
            with contextlib.suppress(Exception):
                self._bodies.close()
        finally:
            if got:
                lock.release()
        with contextlib.suppress(Exception):
            self._lock_file.close()  # releases the flock

    def __enter__(self) -> BufferStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ agent runner support

    def uids_with_prefix(self, prefix: str) -> set[str]:
        """Every uid ever accepted (any state) that starts with `prefix`: the agent runner's
        uids are deterministic, so this is how it finds the episodes already written."""
        if not prefix:
            raise ValueError("prefix: must not be empty")
        with self._db_lock:
            rows = self._conn.execute(
                "SELECT uid FROM uids WHERE uid >= ? AND uid < ?", (prefix, prefix + "\U0010ffff")
            ).fetchall()
        return {uid for (uid,) in rows if uid.startswith(prefix)}

    def instance_counts(self, instance_ids: Iterable[str] | None = None) -> dict[str, InstanceCounts]:
        """Per-instance totals since the database was created (all instances if None); they
        survive the pruning of consumed and dropped records. Unknown instances are left out."""
        query = "SELECT instance_id, accepted, consumed, dropped, groups_consumed FROM instances"
        with self._db_lock:
            if instance_ids is None:
                rows = self._conn.execute(query).fetchall()
            else:
                rows = []
                wanted = list(dict.fromkeys(instance_ids))
                for i in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
                    chunk = wanted[i : i + 500]
                    rows += self._conn.execute(
                        f"{query} WHERE instance_id IN ({','.join('?' * len(chunk))})", chunk
                    ).fetchall()
        return {iid: InstanceCounts(*counts) for iid, *counts in rows}

    def get_meta(self, key: str) -> str | None:
        """A value stored with `set_meta` (None if absent). Keys of other components are
        prefixed with their name, e.g. `runner.curriculum`."""
        with self._db_lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (f"ext.{key}",)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Store a small text value durably (one committed transaction), e.g. curriculum state."""
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (f"ext.{key}", value),
            )

    # ------------------------------------------------------------------ observability

    def write_rate(self, window_s: float = WRITE_RATE_WINDOW_S) -> float:
        """Records accepted per second over the last `window_s` seconds."""
        now = time.monotonic()
        with self._rate_lock:
            while self._recent_writes and self._recent_writes[0][0] < now - max(window_s, 60.0):
                self._recent_writes.popleft()
            return sum(n for t, n in self._recent_writes if t >= now - window_s) / window_s

    def stats(self) -> dict[str, Any]:
        """Counts for /stats and /metrics (applies the time-based rules first)."""
        with self._transaction() as cur:
            eligible, partial = self._pending(cur)
            counters = dict(cur.execute("SELECT name, value FROM counters").fetchall())
            # From the per-group and per-lease rows, not a count of every record.
            active_leases, leased = cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(records), 0) FROM leases WHERE state = 'active'"
            ).fetchone()
        self.collect_segments()  # bodies of records the rules just dropped
        ready_records, partial_records = sum(n for _, n in eligible), sum(n for _, n in partial)
        ready = ready_records + partial_records
        dropped_records = {r: counters.get(f"dropped_records.{r}", 0) for r in DROP_REASONS}
        dropped_groups = {r: counters.get(f"dropped_groups.{r}", 0) for r in DROP_REASONS if r != DROP_STALE}
        return {
            "db": str(self.path),
            "json_backend": fastjson.BACKEND,
            "rules": dataclasses.asdict(self.rules),
            "policy_version": self._policy_version,
            "records": {
                "total": counters.get("records_accepted", 0),  # every uid ever accepted
                "stored": ready + leased,  # bodies held now, waiting for hand-out or ack
                "ready": ready,
                "leased": leased,
                "consumed": counters.get("records_consumed", 0),
                "dropped": sum(dropped_records.values()),
                "duplicates": counters.get("records_duplicate", 0),
                "redelivered": counters.get("records_redelivered", 0),
            },
            "groups": {
                "ready": len(eligible),
                "ready_records": ready_records,
                "partial": len(partial),
                "partial_records": partial_records,
                "leased_total": counters.get("groups_leased", 0),
                "consumed": counters.get("groups_consumed", 0),
            },
            "leases": {
                "active": active_leases,
                "expired": counters.get("leases_expired", 0),
                "released": counters.get("leases_released", 0),
            },
            "dropped_records": dropped_records,
            "dropped_groups": dropped_groups,
            "storage": {
                "body_segments": len(self._bodies.segments()),
                "body_bytes": self._bodies.disk_bytes(),  # freed when every record of a segment is gone
            },
            "json_cache": {**self._cache.stats(), "active": self._json_readers.is_set()},
            "writes_per_s_recent": round(self.write_rate(), 3),
            "write_commits": self._write_commits,
            "write_rate_window_s": WRITE_RATE_WINDOW_S,
        }

    def pragma(self, name: str) -> Any:
        """Read a PRAGMA (tests check journal_mode and synchronous)."""
        with self._db_lock:
            return self._conn.execute(f"PRAGMA {name}").fetchone()[0]
