"""The SQLite schema of the store: its tables, indexes and triggers (`SCHEMA`), its version,
and the opening checks that refuse or migrate a database of another version.

Separate from the store so that the on-disk format reads in one place: what each table holds
and why, and how a database of an older version is brought up to date.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from buffer_server.store.results import StoreError

__all__ = ["MIGRATES_FROM", "SCHEMA", "SCHEMA_VERSION", "check_version", "stamp_or_migrate"]

log = logging.getLogger("buffer_server.store.buffer_store")  # the store's one logger

SCHEMA_VERSION = 3  # 2: packed bodies in a body log, pruned rows, uids and instances tables; 3: ready_groups
MIGRATES_FROM = (2,)  # opened and migrated in place (3: ready_groups built from the records)

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
SCHEMA = f"""
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


def check_version(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a database of another schema version before touching it."""
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if has_meta:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) not in (SCHEMA_VERSION, *MIGRATES_FROM):
            raise StoreError(
                f"{path}: schema version {row[0]}, this server needs {SCHEMA_VERSION} "
                "(start it on a new database file)"
            )


def stamp_or_migrate(cur: sqlite3.Cursor, path: Path) -> int:
    """In the opening transaction, after `SCHEMA` ran: stamp a new database with SCHEMA_VERSION
    and policy version 0, migrate one of an older version, refuse any other. Returns the stored
    policy version."""
    row = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        cur.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        cur.execute("INSERT INTO meta (key, value) VALUES ('policy_version', 0)")
    elif int(row[0]) in MIGRATES_FROM:
        _migrate(cur, path, int(row[0]))
    elif int(row[0]) != SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {row[0]}, this server needs {SCHEMA_VERSION}")
    return int(cur.execute("SELECT value FROM meta WHERE key = 'policy_version'").fetchone()[0])


def _migrate(cur: sqlite3.Cursor, path: Path, version: int) -> None:
    """Bring a database of an older schema to SCHEMA_VERSION, in the opening transaction
    (the new tables and triggers exist by now: SCHEMA creates what is missing)."""
    log.info("%s: migrating the schema from version %d to %d", path, version, SCHEMA_VERSION)
    cur.execute("DELETE FROM ready_groups")
    cur.execute(f"{_RECOUNT} GROUP BY instance_id")
    cur.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
