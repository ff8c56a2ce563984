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
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buffer_server.store.bodylog import DEFAULT_SEGMENT_BYTES, BodyLog
from buffer_server.store.jsoncache import JsonCache
from krl_common import fastjson
from slime_ext.trajectory import codec
from slime_ext.trajectory.codec import EncodedRecord
from slime_ext.trajectory.record import TrajectoryRecord

__all__ = [
    "AckResult",
    "BufferStore",
    "DROP_REASONS",
    "GroupRules",
    "InstanceCounts",
    "Lease",
    "LeaseError",
    "LeasedGroup",
    "PolicyVersionError",
    "PutResult",
    "StoreError",
    "encode_record",
]

log = logging.getLogger("buffer_server.store.buffer_store")

SCHEMA_VERSION = 3  # 2: packed bodies in a body log, pruned rows, uids and instances tables; 3: ready_groups
MIGRATES_FROM = (2,)  # opened and migrated in place (3: ready_groups built from the records)
DROP_STALE = "stale"
DROP_ZERO_VARIANCE = "zero_variance"
DROP_GROUP_TIMEOUT = "group_timeout"
DROP_REASONS: tuple[str, ...] = (DROP_STALE, DROP_ZERO_VARIANCE, DROP_GROUP_TIMEOUT)
# How often a waiting lease re-checks time-based rules (group timeouts, lease expiry) when no
# write wakes it earlier.
WAIT_POLL_S = 0.25
WRITE_RATE_WINDOW_S = 10.0
# A pending group (a ready_groups row) that may be handed out; parameters from _group_params.
_ELIGIBLE = "size >= :size OR (oldest <= :cutoff AND size >= :min_size)"
DEFAULT_JSON_CACHE_BYTES = 256 << 20  # prepared reply JSON (~2000 records of 4k tokens)
# At most one preparer pass per interval: a pass scans every ready row (with thousands of
# partial groups, a pass after every commit cost more CPU than the writes themselves).
PREPARE_INTERVAL_S = 0.1

# The ready_groups rows of the ready records (WHERE clause open: callers narrow and group it).
_RECOUNT = (
    "INSERT INTO ready_groups (instance_id, size, first_seq, oldest, lo, hi, min_version) "
    "SELECT instance_id, COUNT(*), MIN(seq), MIN(stored_at), MIN(reward), MAX(reward), MIN(policy_version) "
    "FROM records WHERE state = 'ready'"
)
# A trigger's recount of the group of the record it fired for.
_RECOUNT_OLD_GROUP = (
    "DELETE FROM ready_groups WHERE instance_id = old.instance_id; "
    f"{_RECOUNT} AND instance_id = old.instance_id GROUP BY instance_id;"
)
_SCHEMA = f"""
-- Every uid ever accepted, also after its record was consumed or dropped and its rows deleted:
-- what idempotency (a late retry is still a duplicate) and the runner's resume need.
CREATE TABLE IF NOT EXISTS uids (uid TEXT PRIMARY KEY CHECK (length(uid) > 0)) WITHOUT ROWID;
-- One row per record held now (ready or leased); deleted when it is consumed or dropped. Its
-- packed body (slime_ext/trajectory/codec.py, ~40 kB) is in the body log (bodylog.py) at
-- segment/offset/length.
-- AUTOINCREMENT: rows are deleted, and a reused seq would break arrival order and the JSON cache.
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL,
    instance_id TEXT NOT NULL CHECK (length(instance_id) > 0),
    policy_version INTEGER NOT NULL,
    reward REAL NOT NULL,
    stored_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('ready', 'leased')),
    lease_id TEXT,
    segment INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_state
    ON records (state, instance_id, stored_at, reward, policy_version);
CREATE INDEX IF NOT EXISTS records_by_lease ON records (lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_by_segment ON records (segment);
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('active', 'acked', 'released', 'expired')),
    groups INTEGER NOT NULL,
    records INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_active ON leases (expires_at) WHERE state = 'active';
-- Per-instance totals that survive pruning (records accepted, consumed, dropped; groups consumed).
CREATE TABLE IF NOT EXISTS instances (
    instance_id TEXT PRIMARY KEY,
    accepted INTEGER NOT NULL DEFAULT 0,
    consumed INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0,
    groups_consumed INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
-- The pending group of each instance (its ready records): size, arrival of its first record,
-- age, reward range, oldest policy version. Kept by the triggers below inside the transactions
-- that change the records, so it cannot drift from them; new records are added by `_insert`,
-- one row update per group and commit (a trigger per inserted record doubled the insert's
-- CPU). The rules and the hand-out read one row per group through these indexes instead of
-- aggregating every ready record (that scan took ~40 ms per lease, under the store lock, with
-- 60k records stored).
CREATE TABLE IF NOT EXISTS ready_groups (
    instance_id TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    oldest REAL NOT NULL,
    lo REAL NOT NULL,
    hi REAL NOT NULL,
    min_version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ready_groups_by_arrival ON ready_groups (first_seq);
CREATE INDEX IF NOT EXISTS ready_groups_by_age ON ready_groups (oldest);
CREATE INDEX IF NOT EXISTS ready_groups_by_version ON ready_groups (min_version);
-- A record leaving or re-entering `ready` (lease, release, expiry, drop): the group's row is
-- computed again from its ready records (a handful, through records_by_state). A lease takes
-- whole groups and deletes a group's row before it moves the group's records: nothing to
-- recount then (the WHEN clause).
CREATE TRIGGER IF NOT EXISTS ready_groups_on_state AFTER UPDATE OF state ON records
WHEN old.state IS NOT new.state
    AND (new.state = 'ready' OR EXISTS (SELECT 1 FROM ready_groups WHERE instance_id = old.instance_id))
BEGIN {_RECOUNT_OLD_GROUP} END;
CREATE TRIGGER IF NOT EXISTS ready_groups_on_delete AFTER DELETE ON records WHEN old.state = 'ready'
BEGIN {_RECOUNT_OLD_GROUP} END;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value NOT NULL);
"""


class StoreError(RuntimeError):
    """The database cannot be used (locked by another server, wrong schema version)."""


class PolicyVersionError(ValueError):
    """A policy version that would move backwards."""


class LeaseError(ValueError):
    """An ack or release that cannot be honoured; `code` is the HTTP status that fits."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


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


@dataclass(frozen=True)
class PutResult:
    accepted: int  # newly stored (and acknowledged) records, stale ones included
    duplicates: int  # uids already known: nothing stored
    stale: int  # of the accepted, dropped on arrival because their policy version is too old


@dataclass(frozen=True)
class LeasedGroup:
    instance_id: str
    records: list[bytes]  # each record's JSON, or its packed body (lease(packed=True)), in arrival order

    def decoded(self) -> list[dict[str, Any]]:
        """The records as JSON objects (of a JSON lease)."""
        return [fastjson.loads(r) for r in self.records]


@dataclass(frozen=True)
class Lease:
    lease_id: str | None  # None when no group was handed out
    groups: list[LeasedGroup]
    expires_at: float | None
    policy_version: int
    waited_s: float

    @property
    def num_records(self) -> int:
        return sum(len(g.records) for g in self.groups)


@dataclass(frozen=True)
class AckResult:
    lease_id: str
    groups: int
    records: int
    already: bool  # this lease had been acked before (a retried ack)


@dataclass(frozen=True)
class InstanceCounts:
    """Totals of one instance_id since the database was created (kept after pruning)."""

    accepted: int  # records accepted (duplicates not counted)
    consumed: int  # records handed out and acked
    dropped: int  # records dropped by a rule (stale, zero variance, group timeout)
    groups_consumed: int  # groups handed out and acked

    @property
    def held(self) -> int:
        """Records stored now (ready, partial or leased)."""
        return self.accepted - self.consumed - self.dropped


@dataclass
class _PendingPut:
    """One put waiting for (or inside) a group commit."""

    rows: list[EncodedRecord]
    locations: list[tuple[int, int]] | None = None  # (segment, offset) of each body, once written
    result: PutResult | None = None
    error: BaseException | None = None
    done: bool = False


def encode_record(record: TrajectoryRecord) -> bytes:
    """The served form of a record: compact UTF-8 JSON of `to_json()` (what `lease` returns;
    the stored form is `codec.encode`, which gives these bytes back with `codec.to_json`)."""
    return fastjson.dumps(record.to_json())


class BufferStore:
    """Thread-safe: one SQLite connection, every transaction under one lock.

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
        self._recent_writes: collections.deque[tuple[float, int]] = collections.deque()
        self._rate_lock = threading.Lock()
        self._put_cond = threading.Condition()
        self._put_queue: list[_PendingPut] = []
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
        self._preparer: threading.Thread | None = None
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
            self._check_schema_version()
            self._conn.executescript(_SCHEMA)
            with self._transaction() as cur:
                row = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    cur.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                    )
                    cur.execute("INSERT INTO meta (key, value) VALUES ('policy_version', 0)")
                elif int(row[0]) in MIGRATES_FROM:
                    self._migrate(cur, int(row[0]))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: schema version {row[0]}, this server needs {SCHEMA_VERSION}"
                    )
                self._policy_version = int(
                    cur.execute("SELECT value FROM meta WHERE key = 'policy_version'").fetchone()[0]
                )
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

    # ------------------------------------------------------------------ plumbing

    def _check_schema_version(self) -> None:
        """Refuse a database of another schema version before touching it."""
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if has_meta:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is not None and int(row[0]) not in (SCHEMA_VERSION, *MIGRATES_FROM):
                raise StoreError(
                    f"{self.path}: schema version {row[0]}, this server needs {SCHEMA_VERSION} "
                    "(start it on a new database file)"
                )

    def _migrate(self, cur: sqlite3.Cursor, version: int) -> None:
        """Bring a database of an older schema to SCHEMA_VERSION, in the opening transaction
        (the new tables and triggers exist by now: _SCHEMA creates what is missing)."""
        log.info("%s: migrating the schema from version %d to %d", self.path, version, SCHEMA_VERSION)
        cur.execute("DELETE FROM ready_groups")
        cur.execute(f"{_RECOUNT} GROUP BY instance_id")
        cur.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))

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

    # ------------------------------------------------------------------ writes

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

    def pending_groups(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Apply the group rules now; return (ready, partial) groups as (instance_id, records).

        Ready groups are eligible for hand-out (the agent runner's backpressure counts them)."""
        with self._transaction() as cur:
            return self._pending(cur)

    def _pending(self, cur: sqlite3.Cursor) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        now = self._clock()
        self._maintain(cur, now)
        return self._eligible(cur, now), self._partial(cur, now)

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

    # ------------------------------------------------------------------ rules

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

    def _eligible(self, cur: sqlite3.Cursor, now: float, limit: int | None = None) -> list[tuple[str, int]]:
        """Eligible groups as (instance_id, size), oldest first (by their first record's
        arrival), at most `limit`; call after `_maintain` (which dropped the flat ones)."""
        return cur.execute(
            f"SELECT instance_id, size FROM ready_groups WHERE {_ELIGIBLE} ORDER BY first_seq LIMIT :limit",
            {**self._group_params(now), "limit": -1 if limit is None else limit},
        ).fetchall()

    def _partial(self, cur: sqlite3.Cursor, now: float) -> list[tuple[str, int]]:
        """Groups still waiting for records, as (instance_id, size)."""
        return cur.execute(
            f"SELECT instance_id, size FROM ready_groups WHERE NOT ({_ELIGIBLE})", self._group_params(now)
        ).fetchall()

    # ------------------------------------------------------------------ reads

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
        rows: list[tuple[int, str, int, int, int]] = []
        expires_at: float | None = None
        while True:
            with self._wake:
                gen = self._write_gen
            with self._transaction() as cur:
                now = self._clock()
                self._maintain(cur, now)
                take = self._eligible(cur, now, max_groups - held)
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
                        # state trigger a recount per record (see _SCHEMA).
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

    def _prepare_loop(self) -> None:
        """Keep the JSON cache filled with the reply JSON of complete groups (jsoncache.py)."""
        while not self._closing:
            started = time.monotonic()
            with self._wake:
                gen = self._write_gen
            try:
                self._prepare_some()
            except Exception:  # never let the preparer die; reads encode on demand meanwhile
                log.exception("JSON preparer")
            with self._wake:
                if self._write_gen == gen and not self._closing:
                    self._wake.wait(WAIT_POLL_S)
            time.sleep(max(0.0, min(PREPARE_INTERVAL_S, started + PREPARE_INTERVAL_S - time.monotonic())))

    def _prepare_some(self) -> None:
        """Prepare the ready records of complete groups, oldest first, until the cache is full.

        Only complete groups: records of partial groups may wait long (or be dropped) and would
        hold the cache's room; a group handed out by its timeout is encoded on demand. Nothing
        until a JSON lease was served (packed readers need no JSON)."""
        if not self._json_readers.is_set():
            return
        if not self._cache.has_room():
            # Full: only a deletion can have left dead entries (a lease pops what it serves), and
            # the purge's lookups hold the database lock that writers need.
            if self._deleted_gen != self._purged_gen:
                self._purged_gen = self._deleted_gen
                self._purge_cache()
            if not self._cache.has_room():
                return
        # Leases take the oldest groups and the cache holds the oldest prepared: the next records
        # to prepare are among the first (held + room) in seq order. The LIMIT keeps a backlog
        # of tens of thousands of records from being sorted and fetched after every lease.
        held, room = self._cache.size_hint()
        with self._db_lock:
            rows = self._conn.execute(
                "SELECT seq, segment, offset, length FROM records WHERE state = 'ready' AND instance_id IN "
                "(SELECT instance_id FROM ready_groups WHERE size >= ?) ORDER BY seq LIMIT ?",
                (self.rules.group_size, held + room + self.rules.group_size),
            ).fetchall()
        prepared = set(self._cache.keys())
        for seq, segment, offset, length in rows:
            if self._closing:
                return
            if seq in prepared:
                continue
            try:
                data = codec.to_json(self._bodies.read(segment, offset, length))
            except (OSError, ValueError):  # deleted meanwhile: nothing to prepare
                continue
            if not self._cache.put(seq, data):
                return  # full: the next lease makes room

    def _purge_cache(self) -> None:
        """Drop prepared JSON of records no longer ready (deleted while being prepared)."""
        keys = self._cache.keys()
        live: set[int] = set()
        with self._db_lock:
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                live.update(
                    seq
                    for (seq,) in self._conn.execute(
                        f"SELECT seq FROM records WHERE state = 'ready' AND seq IN ({','.join('?' * len(chunk))})",
                        chunk,
                    )
                )
        self._cache.discard(k for k in keys if k not in live)

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
