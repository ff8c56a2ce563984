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


def _exclusive_free(path: str) -> bool:
    """Whether another process could take the lock exclusive right now (never waits)."""
    import fcntl
    import os

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor drops a lock it got
    return True


def _ask_exclusive_free(path: str) -> bool:
    with mp.get_context("fork").Pool(1) as pool:
        return pool.apply(_exclusive_free, (path,))


def test_a_paused_shared_hold_lets_another_process_time_until_it_resumes(tmp_path) -> None:
    """A Triton compile inside a shared hold (compile_pause.py) lets other evaluations take the GPU
    exclusive; GPU work after it has the hold back."""
    path = str(tmp_path / "gpu-0.lock")
    lock = GpuLock(path)
    with lock.shared():
        assert not _ask_exclusive_free(path)
        lock.pause()
        lock.pause()  # a second pause (nested compiles) changes nothing
        assert _ask_exclusive_free(path)
        lock.resume()
        assert not _ask_exclusive_free(path)
        lock.resume()  # nothing paused: no-op
    assert _ask_exclusive_free(path)
    assert lock.paused_s > 0
    lock.close()


def test_an_exclusive_hold_is_never_paused(tmp_path) -> None:
    path = str(tmp_path / "gpu-0.lock")
    lock = GpuLock(path)
    with lock.exclusive():
        lock.pause()
        assert not _ask_exclusive_free(path)
        lock.resume()
    lock.pause()  # outside any hold: no-op
    assert lock.paused_s == 0 and _ask_exclusive_free(path)
    lock.close()


def _hold_exclusive_until(path: str, started, release) -> None:
    lock = GpuLock(path)
    with lock.exclusive():
        started.set()
        release.wait(60)


def test_resume_waits_for_the_timing_that_started_during_the_pause(tmp_path) -> None:
    import threading

    path = str(tmp_path / "gpu-0.lock")
    ctx = mp.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    lock = GpuLock(path)
    with lock.shared():
        lock.pause()
        timer = ctx.Process(target=_hold_exclusive_until, args=(path, started, release))
        timer.start()
        assert started.wait(30)
        resumer = threading.Thread(target=lock.resume)
        resumer.start()
        resumer.join(0.2)
        assert resumer.is_alive()  # blocked behind the other process's exclusive hold
        release.set()
        resumer.join(60)
        assert not resumer.is_alive()
        timer.join(30)
    lock.close()


def test_a_hold_ended_while_paused_releases_once_and_counts_the_pause(tmp_path) -> None:
    """A compile that raised never reached the post-compile hook: the hold's end closes the pause."""
    path = str(tmp_path / "gpu-0.lock")
    lock = GpuLock(path)
    with pytest.raises(RuntimeError), lock.shared():
        lock.pause()
        raise RuntimeError("compile failed")
    assert lock.mode is None and lock.paused_s > 0 and _ask_exclusive_free(path)
    with lock.shared():  # still usable
        assert not _ask_exclusive_free(path)
    lock.close()


def test_the_held_time_leaves_out_the_pause_and_reports_it(tmp_path) -> None:
    import torch

    from eval_server.pipeline.context import EvalContext

    lock = GpuLock(str(tmp_path / "gpu-0.lock"))
    ctx = EvalContext(torch.device("cpu"), "cpu", tmp_path, False, gpu_lock=lock)
    t0 = time.perf_counter()
    with ctx.gpu():
        lock.pause()
        time.sleep(0.05)  # a floor for the pause
        lock.resume()
    whole = time.perf_counter() - t0
    paused, held = ctx.phases["compile_unlocked"], ctx.phases["gpu_held_shared"]
    assert paused >= 0.05 and paused == pytest.approx(lock.paused_s, abs=1e-5)
    assert held + paused <= whole + 1e-5  # the pause is not also counted as held
    lock.close()


def test_triton_compiles_pause_the_runners_hold(tmp_path) -> None:
    """The hooks Triton calls around a compile pause and resume the hold (called here as Triton's
    JIT calls them: keyword arguments, the pre-compile hook's result read as "skip the compile")."""
    pytest.importorskip("triton")
    from triton import knobs

    from eval_server.pipeline import compile_pause

    path = str(tmp_path / "gpu-0.lock")
    lock = GpuLock(path)
    saved = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    try:
        assert compile_pause.install(lock)
        with lock.shared():
            assert knobs.runtime.jit_cache_hook(key="k", signature={}, is_warmup=False) is False
            assert _ask_exclusive_free(path)
            knobs.runtime.jit_post_compile_hook(key="k", signature={}, is_warmup=False)
            assert not _ask_exclusive_free(path)
    finally:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved
    lock.close()


def test_a_process_reports_its_waits_and_only_those(tmp_path):
    """Each wait for the lock is reported to the worker's pipe (waiting, then got); an acquire
    that did not wait reports nothing."""
    import os

    from eval_server.isolation import gpu_lock

    path = str(tmp_path / "gpu-0.lock")
    r, w = os.pipe2(os.O_NONBLOCK)
    gpu_lock.report_waits_to(w)
    try:
        with GpuLock(path).shared():  # uncontended: nothing reported
            pass
        ctx = mp.get_context("fork")
        started = ctx.Event()
        holder = ctx.Process(target=_hold, args=(path, True, 0.3, started))
        holder.start()
        assert started.wait(10)
        with GpuLock(path).shared():  # waits for the holder
            pass
        holder.join(10)
        assert os.read(r, 64) == gpu_lock.WAITING + gpu_lock.GOT
    finally:
        gpu_lock.report_waits_to(None)
        os.close(r)
        os.close(w)


def test_the_ledger_credits_each_sources_waits_up_to_its_cap():
    from eval_server.isolation.gpu_lock import GOT, WAITING, WaitLedger

    judge, runner = 1, 2
    ledger = WaitLedger({judge: 10.0, runner: 2.5})
    ledger.feed(judge, WAITING, now=100.0)
    ledger.feed(judge, GOT, now=103.0)
    assert ledger.credit(now=200.0) == 3.0  # closed: whatever the time now
    ledger.feed(runner, WAITING, now=201.0)
    assert ledger.credit(now=202.0) == 4.0  # an ongoing wait counts
    ledger.feed(runner, b"xx" + GOT, now=202.0)  # the last event counts; other bytes ignored
    assert ledger.credit(now=300.0) == 4.0
    ledger.feed(runner, WAITING, now=300.0)  # a wait never closed (or a claimed one): its cap
    ledger.feed(judge, WAITING, now=300.0)
    assert ledger.credit(now=1000.0) == 10.0 + 2.5
    ledger.feed(3, WAITING, now=1000.0)  # a source without a cap counts nothing
    assert ledger.credit(now=2000.0) == 12.5
