"""The worker takes a child's result only when it names the problem it was asked to evaluate
(defence in depth behind static.file_access: a candidate that forged a result into the result pipe
cannot know the problem's hash), and keeps the reference timing a judge measured only with such a
result. A real forked child writes the payload, as an evaluation does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from eval_server import samples
from eval_server.judge.known import KnownReference
from eval_server.schema import EvalResult, TimingStats, parse_request, problem_hash
from eval_server.workers.worker import _Spare, result_payload
from tests.worker_args import cpu_worker


def _child_reporting(
    result: EvalResult, tmp_path: Path, learned: KnownReference | None = None, end: str = "exit 0"
) -> _Spare:
    """A child that writes `result` into its pipe, then ends as a judge does ("exit 0") or as a
    judge never does: "killed" (a candidate that killed its judge and wrote into its pipe through
    /proc) or "exit 3"."""
    read_fd, write_fd = os.pipe()
    waits = [os.pipe() for _ in range(2)]  # its (silent) reports of waits for the GPU lock
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.write(write_fd, result_payload(result, learned))
        os.close(write_fd)
        if end == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3 if end == "exit 3" else 0)
    os.close(write_fd)
    for _, w in waits:
        os.close(w)
    return _Spare(pid, -1, read_fd, tmp_path, (waits[0][0], waits[1][0]))


@pytest.mark.parametrize("named", ["this problem", "no problem"])
def test_a_result_must_name_the_requested_problem(tmp_path: Path, named: str) -> None:
    request = parse_request({"reference": samples.load_problem("relu"), "candidate": "x = 1\n"})
    claimed = problem_hash(request.reference) if named == "this problem" else ""
    forged = EvalResult(status="ok", speedup=100.0, correct=True, problem_hash=claimed)
    stats = TimingStats(median_ms=1.0, min_ms=1.0, mean_ms=1.0, iqr_ms=0.0, cv=0.0, trials=20, method="gpu-time")
    learned = KnownReference("key", stats, 0.1, 0.1, 1.9e6, 5.0)
    worker = cpu_worker(tmp_path)
    got = worker._wait(_child_reporting(forged, tmp_path, learned), request, timeout_s=30)
    if named == "this problem":
        assert (got.status, got.speedup) == ("ok", 100.0)
        assert worker.known.entries(claimed) == [learned.to_json()]
    else:
        assert got.status == "crashed" and got.speedup is None
        assert "not written by the evaluator" in got.error["message"]
        assert len(worker.known) == 0


@pytest.mark.parametrize("end", ["killed", "exit 3"])
def test_a_result_from_a_judge_that_did_not_exit_cleanly_is_not_taken(tmp_path: Path, end: str) -> None:
    request = parse_request({"reference": samples.load_problem("relu"), "candidate": "x = 1\n"})
    forged = EvalResult(status="ok", speedup=100.0, correct=True, problem_hash=problem_hash(request.reference))
    got = cpu_worker(tmp_path)._wait(_child_reporting(forged, tmp_path, end=end), request, timeout_s=30)
    assert got.status == "crashed" and got.speedup is None
    words = "was killed by SIGKILL" if end == "killed" else "exited with code 3"
    assert words in got.error["message"] and "not taken as a result" in got.error["message"]
