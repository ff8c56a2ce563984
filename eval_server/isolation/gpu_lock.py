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
        self.mode: str | None = None  # "shared" or "exclusive" while a hold is open
        self.paused_s = 0.0  # total time a shared hold let go of the lock (pause .. resume)
        self._paused_at: float | None = None

    def acquire(self, exclusive: bool) -> None:
        t0 = time.perf_counter()
        fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.waited_s += time.perf_counter() - t0

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def pause(self) -> None:
        """Let go of an open shared hold for host-only work (a Triton compile: ~0.2-0.3 s of CPU
        per fresh kernel that kept other evaluations' timing waiting). No-op outside a shared
        hold or when already paused: an exclusive hold (timing) is never let go."""
        if self.mode == "shared" and self._paused_at is None:
            self.release()
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        """Take the paused shared hold back before GPU work goes on (its wait counts in waited_s)."""
        if self._paused_at is None:
            return
        self.paused_s += time.perf_counter() - self._paused_at
        self._paused_at = None
        self.acquire(exclusive=False)

    @contextmanager
    def _hold(self, exclusive: bool) -> Iterator[None]:
        self.acquire(exclusive)
        self.mode = "exclusive" if exclusive else "shared"
        try:
            yield
        finally:
            if self._paused_at is not None:  # ended while paused (a compile that raised)
                self.paused_s += time.perf_counter() - self._paused_at
                self._paused_at = None
            self.mode = None
            self.release()

    def shared(self) -> contextmanager:  # type: ignore[valid-type]
        """GPU work that tolerates other GPU work (reference runs, correctness)."""
        return self._hold(False)

    def exclusive(self) -> contextmanager:  # type: ignore[valid-type]
        """Timing: no other evaluation may run GPU work meanwhile."""
        return self._hold(True)

    def close(self) -> None:
        os.close(self._fd)


class MemoryShare:
    """Who may hold the GPU's memory: evaluations that fit their worker's memory share run side by
    side (each holds this shared for its whole run); one whose problem does not fit runs alone,
    with the share of a GPU of one worker (it holds this exclusive). A turnstile taken before either
    keeps a waiting alone evaluation from being passed by a stream of shared ones (flock prefers
    no one). Files beside the GPU lock's; every evaluation process opens its own."""

    def __init__(self, gpu_lock_path: str | Path) -> None:
        self._turnstile = GpuLock(f"{gpu_lock_path}.turnstile")
        self._memory = GpuLock(f"{gpu_lock_path}.memory")

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
