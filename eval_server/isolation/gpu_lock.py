"""A reader-writer lock over one GPU, shared by every evaluation process of that GPU.

Timing must have the GPU to itself, but everything else need not: with two workers on one GPU,
one evaluation's CPU work (fork, CUDA init, imports, static checks) and even its correctness
runs can overlap another's, as long as no GPU work runs while anyone is timing. GPU work
takes the lock shared, timing takes it exclusive. fcntl.flock is per open file description
and is released by the kernel when a process dies, so a killed evaluation never leaves the
GPU locked; each evaluation process must open the file itself (not inherit the descriptor).

flock prefers no one: with several workers on a GPU, shared holders arriving one after another
kept a waiting timing out (4 workers per H200, fresh candidates: exclusive sections waited 10-13 s
for the shared ones). So every acquisition passes a turnstile (a second file, taken exclusive
only while waiting for the lock): a waiting timing keeps later arrivals out until it has the GPU.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class GpuLock:
    def __init__(self, path: str | Path, fair: bool = True) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        # the turnstile (see the module's docstring); MemoryShare has its own
        self._queue = os.open(f"{self.path}.queue", os.O_RDWR | os.O_CREAT, 0o600) if fair else None
        self.waited_s = 0.0  # total time spent waiting for the lock

    def acquire(self, exclusive: bool) -> None:
        t0 = time.perf_counter()
        if self._queue is not None:
            fcntl.flock(self._queue, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if self._queue is not None:
                fcntl.flock(self._queue, fcntl.LOCK_UN)
        self.waited_s += time.perf_counter() - t0

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextmanager
    def _hold(self, exclusive: bool) -> Iterator[None]:
        self.acquire(exclusive)
        try:
            yield
        finally:
            self.release()

    def shared(self) -> contextmanager:  # type: ignore[valid-type]
        """GPU work that tolerates other GPU work (reference runs, correctness)."""
        return self._hold(False)

    def exclusive(self) -> contextmanager:  # type: ignore[valid-type]
        """Timing: no other evaluation may run GPU work meanwhile."""
        return self._hold(True)

    def close(self) -> None:
        os.close(self._fd)
        if self._queue is not None:
            os.close(self._queue)


class MemoryShare:
    """Who may hold the GPU's memory: evaluations that fit their worker's memory share run side by
    side (each holds this shared for its whole run); one whose problem does not fit runs alone,
    with the share of a GPU of one worker (it holds this exclusive). A turnstile taken before either
    keeps a waiting alone evaluation from being passed by a stream of shared ones (flock prefers
    no one). Files beside the GPU lock's; every evaluation process opens its own."""

    def __init__(self, gpu_lock_path: str | Path) -> None:
        self._turnstile = GpuLock(f"{gpu_lock_path}.turnstile", fair=False)
        self._memory = GpuLock(f"{gpu_lock_path}.memory", fair=False)

    @contextmanager
    def hold(self, alone: bool) -> Iterator[None]:
        if alone:
            with self._turnstile.exclusive(), self._memory.exclusive():
                yield
            return
        with self._turnstile.exclusive():
            self._memory.acquire(exclusive=False)
        try:
            yield
        finally:
            self._memory.release()
