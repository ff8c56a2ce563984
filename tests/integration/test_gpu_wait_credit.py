"""Waiting for the GPU lock does not count against an evaluation's time limit, on the real CPU
eval server: with several workers per GPU, a neighbour that holds the lock (a candidate whose
kernel hangs inside its shared hold until its own limit kills it) must not make an honest
evaluation end `timeout`. CPU workers take no GPU lock, so the wait is made by the problem's own
code in the judge (evaluator code, the same `GpuLock` class), on a lock file this test holds for
longer than the evaluation's whole limit."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import httpx
import pytest

from eval_server import samples
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

LIMIT_S = 12.0
HELD_S = LIMIT_S + 2  # longer than the limit: without the credit the evaluation times out

# the judge imports the reference first and waits here; the runner finds the lock free later
_WAIT = """from eval_server.isolation.gpu_lock import GpuLock as _GpuLock
_lock = _GpuLock({path!r})
_lock.acquire(exclusive=True)
_lock.release()
"""


def test_an_evaluation_waiting_for_the_gpu_is_not_timed_out(tmp_path: Path) -> None:
    lock_path = tmp_path / "gpu-0.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a neighbour's hold
    body = {
        "reference": _WAIT.format(path=str(lock_path)) + samples.load_problem("relu"),
        "candidate": samples.load_candidate("relu__correct"),
        "options": {"correctness_trials": 2, "timeout_s": LIMIT_S},
    }
    # the runner opens the same file read-write when it imports the reference: not read-only here
    args = ["--devices", "cpu", "--cpu-workers", "1", "--runner-read-only", "off"]
    with running_eval_server(tmp_path / "srv", *args) as url:
        released = threading.Event()

        def release_later() -> None:
            released.wait(HELD_S)
            fcntl.flock(fd, fcntl.LOCK_UN)

        holder = threading.Thread(target=release_later)
        holder.start()
        try:
            got = httpx.post(f"{url}/eval", json=body, timeout=600).json()
        finally:
            released.set()
            holder.join()
            os.close(fd)
    assert got["status"] == "ok", got["feedback"]
    assert got["phases"]["gpu_wait_credit"] >= LIMIT_S - 0.5  # the whole wait (capped at the limit)


# the candidate's process (which imports the problem from reference.py; the judge from
# judge_reference.py) claims a wait it does not have, as its native code could, and never tells
# the worker it got the lock
_CLAIM = """if __file__.endswith("/reference.py"):
    import os as _os
    from eval_server.isolation import gpu_lock as _gpu_lock
    _os.write(_gpu_lock._report_fd, _gpu_lock.WAITING)
"""


def test_a_claimed_wait_buys_the_candidates_process_at_most_a_quarter_of_its_limit(tmp_path: Path) -> None:
    limit = 4.0
    body = {
        "reference": _CLAIM + samples.load_problem("relu"),
        "candidate": samples.load_candidate("relu__infinite_loop"),
        "options": {"correctness_trials": 2, "timeout_s": limit},
    }
    with running_eval_server(tmp_path / "srv", "--devices", "cpu", "--cpu-workers", "1") as url:
        got = httpx.post(f"{url}/eval", json=body, timeout=600).json()
    assert got["status"] == "timeout", got["feedback"]
    assert limit / 4 - 0.1 <= got["phases"]["gpu_wait_credit"] <= limit / 4
