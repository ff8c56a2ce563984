"""A reader-writer lock over one GPU, shared by every evaluation process of that GPU.

Timing must have the GPU to itself, but everything else need not: with two workers on one GPU,
one evaluation's CPU work (fork, CUDA init, imports, static checks) and even its correctness
runs can overlap another's, as long as no GPU work runs while anyone is timing. GPU work
takes the lock shared, timing takes it exclusive. fcntl.flock is per open file description
and is released by the kernel when a process dies, so a killed evaluation never leaves the
GPU locked; each evaluation process must open the file itself (not inherit the descriptor).

Waiting for the lock is not the waiting evaluation's doing (another one holds the GPU: a neighbour
timing, or one whose kernel hangs inside its shared hold until its own limit kills it), so each
evaluation process reports when it starts and stops waiting (`report_waits_to`: one byte per
event on a pipe to its worker) and the worker does not count that time against the evaluation's
limit (`WaitLedger`, workers/worker.py).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WAITING, GOT = b"W", b"G"  # the events a process reports about its waits for any GPU lock
_report_fd: int | None = None


def report_waits_to(fd: int | None) -> None:
    """Where this process reports its waits for a GPU lock (a pipe's write end; None: nowhere)."""
    global _report_fd
    _report_fd = fd


def _report(event: bytes) -> None:
    if _report_fd is None:
        return
    try:
        os.write(_report_fd, event)
    except OSError:  # a full or closed pipe: the worker then counts the wait as the evaluation's
        pass


class GpuLock:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.waited_s = 0.0  # total time spent waiting for the lock
        self.mode: str | None = None  # "shared" or "exclusive" while a hold is open
        self.paused_s = 0.0  # total time a shared hold let go of the lock (pause .. resume)
        self._paused_at: float | None = None

    def acquire(self, exclusive: bool) -> None:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        t0 = time.perf_counter()
        _report(WAITING)
        try:
            fcntl.flock(self._fd, mode)
        finally:
            _report(GOT)
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


class WaitLedger:
    """The worker's account of one evaluation's waits for the GPU: per source (a process's pipe),
    the time during which it said it was waiting, events timed on the worker's clock as they
    arrive (so a process cannot date them), each source's total at most its cap. The candidate's
    process can claim a wait it does not have: its cap is what that buys it at most."""

    def __init__(self, caps: dict[int, float]) -> None:
        self.caps = caps
        self._since: dict[int, float] = {}  # sources waiting now, since when
        self._closed: dict[int, float] = {}

    def feed(self, source: int, data: bytes, now: float) -> None:
        """Events from `source` (its last one decides whether it is waiting now; other bytes are
        ignored)."""
        events = [b for b in data if b in (WAITING[0], GOT[0])]
        if not events:
            return
        if events[-1] == WAITING[0]:
            self._since.setdefault(source, now)
        elif source in self._since:
            self._closed[source] = self._closed.get(source, 0.0) + now - self._since.pop(source)

    def credit(self, now: float) -> float:
        """Seconds waited so far (ongoing waits included), each source's at most its cap."""
        total = 0.0
        for source, cap in self.caps.items():
            waited = self._closed.get(source, 0.0)
            if source in self._since:
                waited += now - self._since[source]
            total += min(waited, cap)
        return total
