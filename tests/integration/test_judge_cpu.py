"""The judge's verdict does not depend on anything the candidate's process says (CPU workers).

The runner here is the real one (eval_server/runner/serve.py) in a forked process, with its first
layer replaced by what a fully compromised candidate process could do: report whatever it likes,
serve any model, or break the protocol. The judge (eval_server/judge/evaluate.py) must still give
the true verdict.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from eval_server import samples
from eval_server.judge.channel import Channel, RunnerFailed
from eval_server.judge.evaluate import evaluate
from eval_server.judge.pair import fork_runner
from eval_server.pipeline.context import EvalContext
from eval_server.runner.serve import serve
from eval_server.schema import EvalResult, parse_request

pytestmark = pytest.mark.integration

RELU = samples.load_problem("relu")


def _forged_ok() -> dict[str, Any]:
    """What a forged first layer claims: correct, fast."""
    return EvalResult(status="ok", compiled=True, correct=True, speedup=100.0).to_json()


class _Zeros(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class _Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class _RightTwice(torch.nn.Module):
    """Right on the first two calls (what the first layer's trials would see), then stale."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.last = 0, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.last is None or self.calls <= 2:
            self.last = torch.relu(x)
        return self.last


class _WrongShape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)[:1]


def _judge(tmp_path: Path, first_layer: Any, runner_override: Any = None, reference: str = RELU) -> EvalResult:
    workdir = tmp_path / "eval"
    workdir.mkdir()

    def runner_main(sock: socket.socket) -> None:
        if runner_override is not None:
            runner_override(sock)
            return
        serve(sock, torch.device("cpu"), str(workdir), first_layer)

    pid, sock = fork_runner(runner_main)
    try:
        ctx = EvalContext(
            device=torch.device("cpu"), device_label="cpu", workdir=workdir, timing_enabled=False
        )
        request = parse_request({"reference": reference, "candidate": "class ModelNew: pass\n"})
        return evaluate(request, ctx, Channel(sock, deadline=float("inf")))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_an_honest_model_is_ok(tmp_path: Path) -> None:
    result = _judge(tmp_path, lambda req, share, facts: (_forged_ok(), _Relu()))
    assert result.status == "ok" and result.correct, result.feedback


def test_a_forged_ok_report_with_a_wrong_model_is_incorrect(tmp_path: Path) -> None:
    result = _judge(tmp_path, lambda req, share, facts: (_forged_ok(), _Zeros()))
    assert result.status == "incorrect" and not result.correct
    assert result.speedup is None
    assert [c.id for c in result.checks] == ["judge.output"]


def test_a_model_right_only_on_its_first_calls_is_incorrect(tmp_path: Path) -> None:
    def first_layer(req: dict, share: float | None, facts: dict | None) -> tuple[dict, Any]:
        model = _RightTwice()
        x = torch.randn(8)
        model(x), model(x)  # the first layer's own trials
        return _forged_ok(), model

    result = _judge(tmp_path, first_layer)
    assert result.status == "incorrect", result.feedback


def test_a_wrong_shape_is_incorrect_with_the_shapes_in_the_feedback(tmp_path: Path) -> None:
    result = _judge(tmp_path, lambda req, share, facts: (_forged_ok(), _WrongShape()))
    assert result.status == "incorrect"
    assert "shape" in result.feedback


@pytest.mark.parametrize("status", ["server_error", "reference_error", "unsupported"])
def test_a_report_claiming_an_evaluator_status_is_the_candidates_crash(tmp_path: Path, status: str) -> None:
    report = EvalResult(status=status, error={"type": status, "message": "not my fault", "traceback": ""})
    result = _judge(tmp_path, lambda req, share, facts: (report.to_json(), _Relu()))
    assert result.status == "crashed"
    assert "not my fault" in result.feedback


def test_an_unreadable_report_is_a_crash(tmp_path: Path) -> None:
    result = _judge(tmp_path, lambda req, share, facts: ({"status": "ok", "speedup": 9.0, "forged": True}, _Relu()))
    assert result.status == "crashed"


@pytest.mark.parametrize("share", [1e9, -1.0])
def test_a_report_with_a_forged_profile_share_is_a_crash(tmp_path: Path, share: float) -> None:
    """The profiling-based reward multiplies the bonus by own_share: a share past 1 is no factor."""
    report = _forged_ok()
    report["kernel_time"] = {"own_share": share, "own_us": 1.0, "total_us": 1.0}
    result = _judge(tmp_path, lambda req, share_, facts: (report, _Relu()))
    assert result.status == "crashed" and result.kernel_time is None


def test_a_report_cannot_name_the_judges_phases(tmp_path: Path) -> None:
    report = _forged_ok()
    report["phases"] = {"judge_gpu_held_exclusive": 999.0, "correctness": 0.5}
    result = _judge(tmp_path, lambda req, share, facts: (report, _Relu()))
    assert result.status == "ok" and result.phases["correctness"] == 0.5
    assert "judge_gpu_held_exclusive" not in result.phases  # CPU: the judge holds no GPU


def test_a_failing_report_stands(tmp_path: Path) -> None:
    report = EvalResult(status="rejected", checks=[])
    result = _judge(tmp_path, lambda req, share, facts: (report.to_json(), _Relu()))
    assert result.status == "rejected"


def test_a_forward_that_raises_on_the_judges_inputs_is_a_runtime_error(tmp_path: Path) -> None:
    class Raises(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom on secret inputs")

    result = _judge(tmp_path, lambda req, share, facts: (_forged_ok(), Raises()))
    assert result.status == "runtime_error"
    assert "boom on secret inputs" in result.feedback


def _oversized_frame(sock: socket.socket) -> None:
    sock.recv(1 << 16)
    sock.sendall(struct.pack(">I", 1 << 30))


def _closes(sock: socket.socket) -> None:
    sock.close()


@pytest.mark.parametrize("runner", [_oversized_frame, _closes])
def test_a_runner_that_breaks_the_protocol_fails_the_evaluation_not_the_judge(
    tmp_path: Path, runner: Any
) -> None:
    with pytest.raises(RunnerFailed):
        _judge(tmp_path, None, runner_override=runner)


def test_a_report_with_infinite_differences_crosses_and_stands(tmp_path: Path) -> None:
    """An inf max diff (NaN written by the candidate) is null on the wire, and the verdict the
    candidate's own: never the evaluator's server_error."""
    report = EvalResult(status="incorrect", max_abs_diff=float("inf"), max_rel_diff=float("nan"))
    result = _judge(tmp_path, lambda req, share, facts: (report.to_json(), _Relu()))
    assert result.status == "incorrect"
    assert result.max_abs_diff is None


def test_the_judge_imports_the_problem_at_both_shapes_before_the_candidate_is_loaded(tmp_path: Path) -> None:
    """The candidate's process can write the evaluation directory, and the judge imports the
    problem from files it writes there: both (the problem's shape and the second one) must be
    written and imported before the first layer loads the candidate."""
    started = tmp_path / "first-layer-started"

    def first_layer(req: dict, share: float | None, facts: dict | None) -> tuple[dict, Any]:
        started.write_text("")
        return _forged_ok(), _Relu()

    result = _judge(tmp_path, first_layer)
    assert result.status == "ok", result.feedback
    for stem in ("judge_reference", "judge_reference_shape"):
        written = (tmp_path / "eval" / f"{stem}.py").stat().st_mtime_ns
        assert written <= started.stat().st_mtime_ns, stem


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """`t` with a 10-bit mantissa (what tf32 tensor cores read), by truncation."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


class _Tf32Matmul(torch.nn.Module):
    """tf32-rounded operands, what a candidate computes on the calls after the first layer's trial
    0 (its precision check) once it counts its calls: every output within the default tolerance
    (1e-2) of the reference. The first layer here is forged, so every call it serves is the judge's."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _tf32(a) @ _tf32(b)


def test_computing_in_lower_precision_after_the_first_calls_is_incorrect(tmp_path: Path) -> None:
    """The candidate's process checks precision on its first trial only; the judge holds each call
    it compares to the same rule, with facts it measured before the candidate was loaded."""
    matmul = samples.load_problem("matmul")
    # One intra-op thread in this process, which runs the judge's matmuls and then forks the next
    # runner: a forked child deadlocks in a thread pool its parent had started (the server's judges
    # fork their runner before computing anything).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _lazy_and_exact(tmp_path, matmul)
    finally:
        torch.set_num_threads(threads)


def _lazy_and_exact(tmp_path: Path, matmul: str) -> None:
    (tmp_path / "lazy").mkdir()
    (tmp_path / "exact").mkdir()
    lazy = _judge(tmp_path / "lazy", lambda req, share, facts: (_forged_ok(), _Tf32Matmul()), reference=matmul)
    assert lazy.status == "incorrect" and "away from a float64 computation" in lazy.feedback, lazy.feedback
    exact = _judge(tmp_path / "exact", lambda req, share, facts: (_forged_ok(), _Matmul()), reference=matmul)
    assert exact.status == "ok", exact.feedback


class _Matmul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b
