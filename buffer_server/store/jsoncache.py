"""Records' reply JSON, prepared ahead of the batch read that will hand them out.

A packed body (slime_ext/trajectory/codec.py) costs ~0.3 ms of CPU to turn back into its ~118
kB of JSON, so a batch of 256 records would spend ~80 ms encoding before the first byte goes
out. The store's preparer thread fills this cache with the JSON of ready records, oldest first
(the order in which leases take groups), while the trainer is busy; a lease then pops the
prepared bytes and only encodes what is missing. Bounded in bytes; memory only (nothing here
needs durability).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["JsonCache"]


class JsonCache:
    """Thread-safe map record seq -> reply JSON, at most `max_bytes` of values."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: dict[int, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def has_room(self) -> bool:
        """Room for one more entry of the mean size so far: a cache within one entry of its
        bound counts as full (else the preparer would look for work it cannot keep)."""
        return self.size_hint()[1] > 0

    def size_hint(self) -> tuple[int, int]:
        """(entries held, entries of the mean size that still fit; 256 while empty)."""
        with self._lock:
            if not self._items:
                return 0, 256 if self.max_bytes > 0 else 0
            mean = max(1, self._bytes // len(self._items))
            return len(self._items), max(0, (self.max_bytes - self._bytes) // mean)

    def put(self, seq: int, data: bytes) -> bool:
        """Keep `data` unless that would exceed the bound; returns whether it was kept."""
        with self._lock:
            if seq in self._items or self._bytes + len(data) > self.max_bytes:
                return False
            self._items[seq] = data
            self._bytes += len(data)
            return True

    def pop(self, seq: int) -> bytes | None:
        """The prepared JSON of `seq` (removed from the cache), or None; counts hits/misses."""
        with self._lock:
            data = self._items.pop(seq, None)
            if data is None:
                self.misses += 1
            else:
                self.hits += 1
                self._bytes -= len(data)
            return data

    def discard(self, seqs: Iterable[int]) -> None:
        with self._lock:
            for seq in seqs:
                data = self._items.pop(seq, None)
                if data is not None:
                    self._bytes -= len(data)

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._items)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "records": len(self._items),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
            }
