"""Evaluations that do not fit their worker's memory share run alone on the GPU: MemoryShare's
modes (probed with non-blocking locks, never timed), and the worker's decision to run an
evaluation again alone."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from eval_server.feedback import failure_result
from eval_server.isolation.gpu_lock import MemoryShare
from eval_server.schema import (
    STATUS_CRASHED,
    STATUS_OK,
    STATUS_REFERENCE_ERROR,
    STATUS_RUNTIME_ERROR,
    STATUS_SERVER_ERROR,
    EvalResult,
    parse_request,
    result_for,
)
from eval_server.workers.worker import Worker, out_of_memory
from tests.worker_args import cpu_worker_args

pytestmark = pytest.mark.unit


def _free(path: str, exclusive: bool) -> bool:
    """Whether `path` could be locked in this mode now (another open file description's view)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_shared_holders_coexist_and_alone_excludes_them(tmp_path: Path) -> None:
    lock = str(tmp_path / "gpu-0.lock")
    a, b = MemoryShare(lock), MemoryShare(lock)
    with a.hold(alone=False), b.hold(alone=False):
        assert not _free(f"{lock}.memory", exclusive=True)
        assert _free(f"{lock}.memory", exclusive=False)
        assert _free(f"{lock}.turnstile", exclusive=True)  # passed, not held
    with a.hold(alone=True):
        assert not _free(f"{lock}.memory", exclusive=False)
        assert not _free(f"{lock}.turnstile", exclusive=True)
    assert _free(f"{lock}.memory", exclusive=True)


def test_a_waiting_alone_evaluation_is_not_passed_by_shared_ones(tmp_path: Path) -> None:
    lock = str(tmp_path / "gpu-0.lock")
    running, alone = MemoryShare(lock), MemoryShare(lock)
    entered = threading.Event()

    def run_alone() -> None:
        with alone.hold(alone=True):
            entered.set()

    with running.hold(alone=False):
        t = threading.Thread(target=run_alone)
        t.start()
        while _free(f"{lock}.turnstile", exclusive=True):  # until the alone one holds the turnstile
            threading.Event().wait(0.001)
        # a new evaluation now queues behind it: the turnstile is taken, the memory still shared
        assert not _free(f"{lock}.turnstile", exclusive=True)
        assert not entered.is_set()
    t.join()
    assert entered.is_set()


_OOM = "Evaluator failure: OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB."
_REQUEST = parse_request({"reference": "x = 1\n", "candidate": "y = 2\n"})


def _result(status: str, message: str = "") -> EvalResult:
    return failure_result(_REQUEST, status, message) if message else result_for(_REQUEST, status, "cuda:0")


def test_out_of_memory_is_read_from_the_statuses_a_process_out_of_its_share_ends_with() -> None:
    assert out_of_memory(_result(STATUS_SERVER_ERROR, _OOM))
    assert out_of_memory(_result(STATUS_RUNTIME_ERROR, "torch.OutOfMemoryError: CUDA out of memory"))
    # the judge's reference (1x H200, 6 workers, KernelBench's ReLU at its real size)
    assert out_of_memory(_result(STATUS_REFERENCE_ERROR, "The reference failed: " + _OOM))
    # the evaluator's code in the candidate's process, its first layer (4 workers, the sum reduction)
    assert out_of_memory(_result(STATUS_CRASHED, "The candidate's process failed while it was checked:\n" + _OOM))
    assert not out_of_memory(_result(STATUS_CRASHED, "The candidate's process failed: KeyError: 'x'"))
    assert not out_of_memory(_result(STATUS_SERVER_ERROR, "Evaluator failure: KeyError: 'x'"))
    assert not out_of_memory(_result("incorrect", _OOM))
    assert not out_of_memory(_result(STATUS_OK))


class _ScriptedWorker(Worker):
    """The worker's decision with its attempts replaced by scripted results (the attempts
    themselves fork a judge and a runner on a GPU: tests/gpu)."""

    def __init__(self, args: Any, results: list[EvalResult]) -> None:
        super().__init__(args)
        self.results = results
        self.attempts: list[bool] = []

    def _attempt(self, request: Any, timeout_s: float, alone: bool) -> EvalResult:
        self.attempts.append(alone)
        return self.results.pop(0)


def _gpu_args(tmp_path: Path, share: float) -> Any:
    args = cpu_worker_args(tmp_path)
    args.device, args.device_label = "cuda", "cuda:0"
    args.gpu_lock = str(tmp_path / "gpu-0.lock")
    args.hardening = f'{{"gpu_memory_fraction": {share}}}'
    return args


@pytest.mark.parametrize("status", [STATUS_SERVER_ERROR, STATUS_REFERENCE_ERROR])
def test_a_judge_out_of_its_share_runs_again_alone_and_its_problem_stays_alone(tmp_path: Path, status: str) -> None:
    worker = _ScriptedWorker(
        _gpu_args(tmp_path, 0.475),
        [_result(status, _OOM), _result(STATUS_OK), _result(STATUS_OK)],
    )
    first = worker.run_one(_REQUEST.to_json(), 60.0)
    assert first.status == STATUS_OK and "out_of_share_attempt" in first.phases
    assert worker.run_one(_REQUEST.to_json(), 60.0).status == STATUS_OK
    assert worker.attempts == [False, True, True]


@pytest.mark.parametrize("status", [STATUS_RUNTIME_ERROR, STATUS_CRASHED])
def test_a_candidate_out_of_memory_gets_one_retry_and_is_not_remembered(tmp_path: Path, status: str) -> None:
    oom = _result(status, "torch.OutOfMemoryError: CUDA out of memory")
    worker = _ScriptedWorker(_gpu_args(tmp_path, 0.475), [oom, oom, _result(STATUS_OK)])
    assert worker.run_one(_REQUEST.to_json(), 60.0).status == status
    assert worker.run_one(_REQUEST.to_json(), 60.0).status == STATUS_OK
    assert worker.attempts == [False, True, False]


@pytest.mark.parametrize("share", [0.95, 1.0])
def test_no_retry_without_a_shared_gpu(tmp_path: Path, share: float) -> None:
    args = _gpu_args(tmp_path, share) if share < 1 else cpu_worker_args(tmp_path)
    if share < 1:
        args.gpu_lock = ""  # a single worker per GPU has no lock file
    worker = _ScriptedWorker(args, [_result(STATUS_SERVER_ERROR, _OOM)])
    assert worker.run_one(_REQUEST.to_json(), 60.0).status == STATUS_SERVER_ERROR
    assert worker.attempts == [False]
