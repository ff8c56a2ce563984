"""The JSON preparer: a background thread that keeps the JSON cache (jsoncache.py) filled
with the reply JSON of the ready records of complete groups, so a JSON lease pops prepared
bytes instead of encoding ~0.3 ms of JSON per record while the reader waits.

Separate because it runs on its own thread, outside every request, and only reads the store.
"""

from __future__ import annotations

import logging
import threading
import time

from buffer_server.store.core import WAIT_POLL_S, StoreCore
from slime_ext.trajectory import codec

__all__ = ["DEFAULT_JSON_CACHE_BYTES", "PREPARE_INTERVAL_S", "JsonPreparer"]

log = logging.getLogger("buffer_server.store.buffer_store")  # the store's one logger

DEFAULT_JSON_CACHE_BYTES = 256 << 20  # prepared reply JSON (~2000 records of 4k tokens)
# At most one preparer pass per interval: a pass scans every ready row (with thousands of
# partial groups, a pass after every commit cost more CPU than the writes themselves).
PREPARE_INTERVAL_S = 0.1


class JsonPreparer(StoreCore):
    """The preparer thread's loop (`BufferStore.__init__` starts it, `close` stops it)."""

    # Set by BufferStore.__init__.
    _closing: bool
    _preparer: threading.Thread | None
    _purged_gen: int  # the _deleted_gen that the last purge handled

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
