"""A reader-writer lock over one GPU, shared by every evaluation process of that GPU.

Timing must have the GPU to itself, but everything else need not: with two workers on one GPU,
one evaluation's CPU work (fork, CUDA init, imports, static checks) and even its correctness
runs can overlap another's, as long as no GPU work runs while anyone is timing. GPU work
takes the lock shared, timing takes it exclusive. fcntl.flock is per open file description
and is released by the kernel when a process dies, so a killed evaluation never leaves the
GPU locked; each evaluation process must open the file itself (not inherit the descriptor).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class GpuLock:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.waited_s = 0.0  # total time spent waiting for the lock

    @contextmanager
    def _hold(self, mode: int) -> Iterator[None]:
        t0 = time.perf_counter()
        fcntl.flock(self._fd, mode)
        self.waited_s += time.perf_counter() - t0
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def shared(self) -> contextmanager:  # type: ignore[valid-type]
        """GPU work that tolerates other GPU work (reference runs, correctness)."""
        return self._hold(fcntl.LOCK_SH)

    def exclusive(self) -> contextmanager:  # type: ignore[valid-type]
        """Timing: no other evaluation may run GPU work meanwhile."""
        return self._hold(fcntl.LOCK_EX)

    def close(self) -> None:
        os.close(self._fd)
