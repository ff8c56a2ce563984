"""The spare's preparation marker (gpu_lock.py): a preparing child holds it shared, and a
re-timing waits until no one holds it, at most a bounded time."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import pytest
import torch

from eval_server import child_prep, worker
from eval_server.evaluate import EvalContext
from eval_server.gpu_lock import GpuLock, preparation_lock_path, wait_until_free
from tests.worker_args import cpu_worker_args


def _hold_for(path: str, seconds: float) -> threading.Thread:
    """Another holder of `path`'s lock (shared, its own file description) for `seconds`."""
    held = threading.Event()

    def hold() -> None:
        with GpuLock(path).shared():
            held.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    return thread


def test_free_at_once_when_nobody_prepares(tmp_path: Path) -> None:
    t0 = time.monotonic()
    assert wait_until_free(tmp_path / "gpu.lock.prep", timeout_s=5.0)
    assert time.monotonic() - t0 < 0.5


def test_waits_for_a_preparation_to_end(tmp_path: Path) -> None:
    path = tmp_path / "gpu.lock.prep"
    thread = _hold_for(str(path), 0.3)
    t0 = time.monotonic()
    assert wait_until_free(path, timeout_s=5.0)
    assert 0.1 <= time.monotonic() - t0 < 2.0
    thread.join()


def test_gives_up_after_the_timeout_when_a_preparation_hangs(tmp_path: Path) -> None:
    path = tmp_path / "gpu.lock.prep"
    lock = GpuLock(path)
    with lock.shared():
        t0 = time.monotonic()
        assert not wait_until_free(path, timeout_s=0.2)
        assert 0.2 <= time.monotonic() - t0 < 1.0
    lock.close()


def test_the_spare_holds_the_marker_while_it_prepares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_lock = tmp_path / "gpu.lock"
    args = argparse.Namespace(
        **{**vars(cpu_worker_args(tmp_path)), "device": "cuda", "gpu_lock": str(gpu_lock)}
    )
    seen: list[bool] = []
    monkeypatch.setattr(
        child_prep,
        "prepare",
        lambda device: seen.append(wait_until_free(preparation_lock_path(gpu_lock), 0.0)),
    )
    worker.Worker(args)._child_prepare()
    assert seen == [False]  # held during the preparation...
    assert wait_until_free(preparation_lock_path(gpu_lock), 0.0)  # ...and released after it


def test_an_evaluation_waits_for_preparations_and_reports_it(tmp_path: Path) -> None:
    gpu_lock = tmp_path / "gpu.lock"
    ctx = EvalContext(device=torch.device("cpu"), device_label="x", workdir=tmp_path, timing_enabled=True,
                      gpu_lock=GpuLock(gpu_lock))  # fmt: skip
    thread = _hold_for(preparation_lock_path(gpu_lock), 0.3)
    ctx.wait_for_preparations()
    thread.join()
    assert 0.1 <= ctx.phases["prep_wait"] < 2.0
    no_lock = EvalContext(
        device=torch.device("cpu"), device_label="x", workdir=tmp_path, timing_enabled=False
    )
    no_lock.wait_for_preparations()
    assert "prep_wait" not in no_lock.phases
