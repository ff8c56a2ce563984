"""Process checks shared by the tests that stop a tool or server and look for what it left."""

from __future__ import annotations

import time

import psutil


def still_running(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """Those of `pids` still running after `grace_s` (a zombie is not: it has exited, its parent
    has not reaped it). The grace: multiprocessing's resource tracker ends just after its parent."""
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
