"""GpuLock: shared holders coexist, exclusive excludes, a killed holder releases the lock."""

from __future__ import annotations

import multiprocessing as mp
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


def test_an_evaluation_reports_how_long_it_held_the_lock_in_each_mode(tmp_path) -> None:
    """The holds are what the GPU's other evaluations wait behind: the bench sums them."""
    import torch

    from eval_server.pipeline.context import EvalContext

    lock = GpuLock(str(tmp_path / "gpu-0.lock"))
    ctx = EvalContext(torch.device("cpu"), "cpu", tmp_path, False, gpu_lock=lock)
    for _ in range(2):
        with ctx.gpu():
            time.sleep(0.01)  # a floor the hold cannot be under, whatever the machine's load
    with pytest.raises(RuntimeError), ctx.gpu(exclusive=True):
        time.sleep(0.02)
        raise RuntimeError("a failure inside still counts its hold")
    assert ctx.phases["gpu_held_shared"] >= 0.02 and ctx.phases["gpu_held_exclusive"] >= 0.02
    assert "gpu_wait" in ctx.phases
    lock.close()
