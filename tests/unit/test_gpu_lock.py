"""GpuLock: shared holders coexist, exclusive excludes, a killed holder releases the lock."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from eval_server.isolation.gpu_lock import GpuLock

pytestmark = pytest.mark.unit


def _hold(path: str, exclusive: bool, seconds: float, started) -> None:
    lock = GpuLock(path)  # each process opens its own descriptor, as evaluation children do
    with lock.exclusive() if exclusive else lock.shared():
        started.set()
        time.sleep(seconds)


def _acquire_time(path: str, exclusive: bool) -> float:
    lock = GpuLock(path)
    t0 = time.perf_counter()
    with lock.exclusive() if exclusive else lock.shared():
        pass
    return time.perf_counter() - t0


@pytest.mark.parametrize(
    ("holder_exclusive", "waiter_exclusive", "blocks"),
    [(False, False, False), (False, True, True), (True, False, True), (True, True, True)],
)
def test_lock_modes(tmp_path, holder_exclusive, waiter_exclusive, blocks):
    path = str(tmp_path / "gpu-0.lock")
    ctx = mp.get_context("fork")
    started = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, holder_exclusive, 0.6, started))
    holder.start()
    assert started.wait(10)
    waited = _acquire_time(path, waiter_exclusive)
    holder.join(10)
    assert (waited > 0.3) == blocks, waited


def test_killed_holder_releases(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    ctx = mp.get_context("fork")
    started = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, True, 60, started))
    holder.start()
    assert started.wait(10)
    holder.kill()
    holder.join(10)
    assert _acquire_time(path, True) < 1.0


def test_wait_time_is_accounted(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    ctx = mp.get_context("fork")
    started = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, True, 0.5, started))
    holder.start()
    assert started.wait(10)
    lock = GpuLock(path)
    with lock.shared():
        pass
    holder.join(10)
    assert 0.2 < lock.waited_s < 5


def _log_when_held(path: str, exclusive: bool, log: str, name: str) -> None:
    lock = GpuLock(path)
    with lock.exclusive() if exclusive else lock.shared(), open(log, "a") as fh:
        fh.write(name + "\n")


def _waiting_for(path: str) -> bool:
    """Whether a process waits for an flock of the file at `path` (Linux: a "->" line of /proc/locks)."""
    if not os.path.exists(path):
        return False
    inode = os.stat(path).st_ino
    with open("/proc/locks") as fh:
        return any("->" in ln and ln.split()[6].split(":")[-1] == str(inode) for ln in fh if "FLOCK" in ln)


def test_a_waiting_timing_is_not_passed_by_later_shared_holders(tmp_path):
    """flock alone let shared holders that came later go first, again and again: the timing waits
    in the turnstile, and a shared holder arriving meanwhile gets the GPU after it."""
    path, log = str(tmp_path / "gpu-0.lock"), str(tmp_path / "order.log")
    ctx = mp.get_context("fork")
    first = GpuLock(path)
    first.acquire(exclusive=False)
    timing = ctx.Process(target=_log_when_held, args=(path, True, log, "timing"))
    timing.start()
    while not _waiting_for(path):  # the timing waits for the shared holder
        time.sleep(0.01)
    later = ctx.Process(target=_log_when_held, args=(path, False, log, "later shared"))
    later.start()
    # it is in line behind the timing, or (flock alone) it already got the GPU beside `first`
    while not (_waiting_for(f"{path}.queue") or os.path.exists(log)):
        time.sleep(0.01)
    first.release()
    timing.join(30)
    later.join(30)
    with open(log) as fh:
        assert fh.read().split("\n")[:2] == ["timing", "later shared"]
