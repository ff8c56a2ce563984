"""Back-to-back evaluations: the worker tells each child when the GPU was last timed (a header
line before the request), and the reference's timing takes the short warm-up only when that was
at most `warm_gap_s` ago."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server.isolation.hardening import Hardening
from eval_server.pipeline.timing_phase import gpu_recently_timed
from eval_server.schema import EvalResult
from eval_server.workers.worker import parse_request_header, request_header
from tests.worker_args import cpu_worker


@pytest.mark.parametrize("busy_at", [None, 1234.5, 0.0])
@pytest.mark.parametrize("alone", [False, True])
def test_request_header_round_trip(busy_at: float | None, alone: bool) -> None:
    line = request_header(99.25, busy_at, alone)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_request_header(line.rstrip(b"\n")) == (99.25, busy_at, alone)


def test_recently_timed_only_within_the_gap() -> None:
    assert gpu_recently_timed(100.0, 1.0, 100.4)
    assert gpu_recently_timed(100.0, 1.0, 101.0)
    assert not gpu_recently_timed(100.0, 1.0, 101.5)
    assert not gpu_recently_timed(None, 1.0, 100.0)  # no timing yet in this worker
    assert not gpu_recently_timed(100.0, 0.0, 100.2)  # warm_gap_s 0: never
    assert not gpu_recently_timed(100.0, 1.0, 99.0)  # a time from the future is not trusted


def test_negative_gap_is_refused() -> None:
    with pytest.raises(ValueError, match="warm_gap_s"):
        Hardening(warm_gap_s=-1.0)


def test_worker_notes_only_evaluations_that_ran_timing(tmp_path: Path) -> None:
    w = cpu_worker(tmp_path)
    w._note_timing(EvalResult(status="ok", phases={"correctness": 0.3, "child_exit": 0.1}), now=50.0)
    assert w._gpu_busy_at is None  # no timing phase: the GPU was not timed
    w._note_timing(EvalResult(status="ok", phases={"timing": 0.4, "child_exit": 0.25}), now=60.0)
    assert w._gpu_busy_at == pytest.approx(59.75)  # the result was complete before the child's exit
    w._note_timing(EvalResult(status="compile_error", phases={"static": 0.01}), now=70.0)
    assert w._gpu_busy_at == pytest.approx(59.75)
