"""The latency parts a result reports besides its evaluation phases: `queue_wait` (server: waiting
for an idle worker), `spare_wait` (the request waiting for the prepared child) and `child_exit`
(the child's exit after its result was complete). One CPU worker, real HTTP."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from pathlib import Path

import httpx
import pytest

from eval_server import samples
from eval_server.workers import worker
from tests.conftest import running_eval_server
from tests.worker_args import cpu_worker_args

pytestmark = pytest.mark.integration


def _body(candidate: str, **options: float) -> dict:
    return {
        "reference": samples.load_problem("relu"),
        "candidate": samples.load_candidate(candidate),
        "options": {"correctness_trials": 2, **options},
    }


def test_queue_wait_is_the_time_behind_another_request(tmp_path: Path) -> None:
    with running_eval_server(tmp_path, "--devices", "cpu", "--cpu-workers", "1") as url:
        first = httpx.post(f"{url}/eval", json=_body("relu__correct"), timeout=120).json()
        assert first["status"] == "ok", first["feedback"]
        ph = first["phases"]
        assert ph["queue_wait"] < 0.5  # nothing ahead of it
        assert 0 <= ph["spare_wait"] < first["elapsed_s"]  # CPU children have nothing to prepare
        assert 0 <= ph["child_exit"] < first["elapsed_s"]
        # sub-phases: inside their phases (two correctness trials, each one expected output and one comparison)
        assert 0 < ph["judge_precision"] <= ph["judge_reference"]  # the judge's float64 pass
        assert "reference_precision" not in ph  # the candidate's process got the judge's facts
        assert 0 < ph["expected"] + ph["compare"] <= ph["correctness"]

        with cf.ThreadPoolExecutor(max_workers=2) as ex:
            slow = ex.submit(
                httpx.post, f"{url}/eval", json=_body("relu__infinite_loop", timeout_s=3.0), timeout=120
            )
            time.sleep(0.5)  # the slow one holds the only worker
            t = time.perf_counter()
            behind = (
                ex.submit(httpx.post, f"{url}/eval", json=_body("relu__correct"), timeout=120).result().json()
            )
            latency = time.perf_counter() - t
            assert slow.result().json()["status"] == "timeout"
    assert behind["status"] == "ok", behind["feedback"]
    assert behind["phases"]["queue_wait"] > 1.5  # most of the slow one's 3 s
    # What the client waited is the queue plus the evaluation, and little else.
    assert latency - behind["phases"]["queue_wait"] - behind["elapsed_s"] < 0.5


def test_spare_wait_is_the_wait_for_a_slow_preparation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process worker whose child preparation takes 1 s: the first request (no spare yet)
    waits for all of it, and says so."""
    args = cpu_worker_args(tmp_path)
    (tmp_path / "evals").mkdir()
    monkeypatch.setattr(worker, "_PROTO_FD", os.dup(1))  # the child closes its copy of the protocol fd
    monkeypatch.setattr(worker.Worker, "_child_prepare", lambda self, judge=False: time.sleep(1.0))
    w = worker.Worker(args)
    try:
        # A candidate with a syntax error: the evaluation ends at the static checks.
        request = {"reference": samples.load_problem("relu"), "candidate": "def broken(:\n"}
        result = w.run_one(request, timeout_s=60.0)
    finally:
        w.close()
    assert result.status == "compile_error", result.feedback
    assert 0.9 <= result.phases["spare_wait"] <= result.elapsed_s
    assert result.phases["spare_prepare"] >= 1.0  # the preparation itself, however long it waited
    assert result.phases["child_exit"] < result.elapsed_s
