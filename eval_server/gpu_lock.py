"""A reader-writer lock over one GPU, shared by every evaluation process of that GPU.

Timing must have the GPU to itself, but everything else need not: with two workers on one GPU,
one evaluation's CPU work (fork, CUDA init, imports, static checks) and even its correctness
runs can overlap another's, as long as no GPU work runs while anyone is timing. GPU work
takes the lock shared, timing takes it exclusive. fcntl.flock is per open file description
and is released by the kernel when a process dies, so a killed evaluation never leaves the
GPU locked; each evaluation process must open the file itself (not inherit the descriptor).

A second file beside it (`preparation_lock_path`) marks the spare children's CUDA preparation
(worker.py): a child holds it shared while it creates its context and launches its first
kernels, which it does without the GPU lock, in parallel with the running evaluation. An
evaluation whose timing saw escaped work waits until no preparation runs
(`wait_until_free`) before it re-times: a legitimate few-microsecond kernel was rejected by
`runtime.escaped_timing` in all three timings now and then, more often with two children
preparing at once (docs/GPU_TESTS.md), and escaped work of the candidate's own still shows in
a quiet re-timing.
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


def preparation_lock_path(gpu_lock_path: str | Path) -> str:
    """The file the spare children of this GPU hold while they prepare (module docstring)."""
    return f"{gpu_lock_path}.prep"


def wait_until_free(path: str | Path, timeout_s: float, poll_s: float = 0.01) -> bool:
    """Wait until no process holds `path`'s lock, at most `timeout_s`: True when it is free.
    Polls without blocking, so a holder that hangs costs at most the timeout."""
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(poll_s)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
    finally:
        os.close(fd)
