"""Append-only segment files that hold the packed record bodies; SQLite holds only small rows.

Why not SQLite: in WAL mode every page is written twice (to the WAL at commit, to the database
at checkpoint), and a ~40 kB body spans several pages, so each record cost ~95 kB of fsynced
writes; at 2000 records/s that is more than the development VM's disk sustains. Here a body is
written once, in a segment file, and SQLite records where it is.

Durability protocol (what makes an acknowledged record survive kill -9 and power loss):
1. `append` writes the bodies of a group commit to the active segment and fdatasyncs it; a new
   segment file is created with O_EXCL and its directory fsynced before anything refers to it;
2. only then does the store commit the rows that point at them (SQLite WAL, synchronous=FULL);
3. the store acknowledges after that commit.
A crash between 1 and 2 leaves unreferenced bytes, never a row without its body. A segment is
never appended to after a restart (the next one is opened), so a torn tail is never read.

Pruning: a segment is deleted once no stored row points into it (`remove`, called by the store
after the commit that deleted the last rows) and it is not the one being appended to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["BodyLog", "BodyLogError", "DEFAULT_SEGMENT_BYTES"]

DEFAULT_SEGMENT_BYTES = 64 << 20
_PREFIX, _SUFFIX = "seg-", ".bodies"
_IOV_MAX = 512  # fewer buffers per writev than any Linux IOV_MAX (1024)


class BodyLogError(OSError):
    """The body files cannot be written or read (disk full, I/O error, a missing segment)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BodyLog:
    """Not safe for concurrent `append`s (the store's group-commit leader is the only writer);
    `read` may run in any thread, concurrently with `append`."""

    def __init__(self, directory: str | Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        _fsync_dir(self.directory.parent)
        existing = self.segments()
        self._next_id = (max(existing) + 1) if existing else 1
        self._active: int | None = None  # segment id being appended to (opened on first append)
        self._active_fd = -1
        self._active_size = 0
        self._read_fds: dict[int, int] = {}
        self._lock = threading.Lock()  # guards _read_fds and the active segment's identity

    def path(self, segment: int) -> Path:
        return self.directory / f"{_PREFIX}{segment:08d}{_SUFFIX}"

    def disk_bytes(self) -> int:
        """Bytes held by the segment files."""
        total = 0
        for segment in self.segments():
            try:
                total += self.path(segment).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def segments(self) -> list[int]:
        """Ids of the segment files on disk."""
        ids = []
        for p in self.directory.glob(f"{_PREFIX}*{_SUFFIX}"):
            stem = p.name[len(_PREFIX) : -len(_SUFFIX)]
            if stem.isdigit():
                ids.append(int(stem))
        return sorted(ids)

    @property
    def active(self) -> int | None:
        return self._active

    def _rotate(self) -> None:
        segment = self._next_id
        fd = os.open(self.path(segment), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        _fsync_dir(self.directory)  # the file's name is durable before any row points into it
        with self._lock:
            old_fd = self._active_fd
            self._active, self._active_fd, self._active_size = segment, fd, 0
            self._next_id = segment + 1
        if old_fd >= 0:
            os.close(old_fd)

    def append(self, bodies: Sequence[bytes]) -> list[tuple[int, int]]:
        """Write `bodies` durably (fdatasync); returns (segment, offset) of each, in order."""
        if not bodies:
            return []
        try:
            if self._active is None or self._active_size >= self.segment_bytes:
                self._rotate()
            segment, offset = self._active, self._active_size
            locations = []
            for body in bodies:
                locations.append((segment, offset))
                offset += len(body)
            pending = [memoryview(b) for b in bodies if b]
            while pending:
                written = os.writev(self._active_fd, pending[:_IOV_MAX])
                while written and pending:
                    if written >= len(pending[0]):
                        written -= len(pending.pop(0))
                    else:
                        pending[0], written = pending[0][written:], 0
            os.fdatasync(self._active_fd)
        except OSError as exc:
            # The segment may end in a partial write: never append to it again.
            self._active = None
            raise BodyLogError(exc.errno, f"cannot write record bodies to {self.directory}: {exc}") from exc
        assert segment is not None
        self._active_size = offset
        return locations  # type: ignore[return-value]

    def read(self, segment: int, offset: int, length: int) -> bytes:
        with self._lock:
            fd = self._read_fds.get(segment)
            if fd is None:
                try:
                    fd = os.open(self.path(segment), os.O_RDONLY)
                except OSError as exc:
                    raise BodyLogError(exc.errno, f"record body segment {segment} unreadable: {exc}") from exc
                self._read_fds[segment] = fd
            data = os.pread(fd, length, offset)  # under the lock: `remove` cannot close fd meanwhile
        if len(data) != length:
            raise BodyLogError(0, f"record body at segment {segment} offset {offset} is truncated")
        return data

    def remove(self, segments: Iterable[int]) -> list[int]:
        """Delete these segments (never the active one); returns the ids deleted."""
        removed = []
        for segment in segments:
            with self._lock:
                if segment == self._active:
                    continue
                fd = self._read_fds.pop(segment, None)
                if fd is not None:
                    os.close(fd)
            try:
                self.path(segment).unlink()
                removed.append(segment)
            except FileNotFoundError:
                pass
        return removed

    def close(self) -> None:
        with self._lock:
            for fd in [*self._read_fds.values(), self._active_fd]:
                if fd >= 0:
                    os.close(fd)
            self._read_fds.clear()
            self._active, self._active_fd = None, -1
