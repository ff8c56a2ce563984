"""tools.eval_one against the real CPU eval server: the feedback the model would see, the
summary, and the exit code by status."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import samples
from tools import eval_one

pytestmark = pytest.mark.integration


def _files(tmp_path: Path, problem: str, candidate: str) -> tuple[str, str]:
    p, c = tmp_path / f"{problem}.py", tmp_path / f"{candidate}.py"
    p.write_text(samples.load_problem(problem))
    c.write_text(samples.load_candidate(candidate))
    return str(p), str(c)


@pytest.mark.parametrize(
    ("candidate", "status", "code"),
    [
        ("relu__correct", "ok", 0),
        ("relu__wrong_math", "incorrect", 12),
        ("relu__syntax_error", "compile_error", 10),
    ],
)
def test_one_candidate_prints_its_feedback_and_exits_by_status(
    cpu_server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    candidate: str,
    status: str,
    code: int,
) -> None:
    problem, cand = _files(tmp_path, "relu", candidate)
    assert eval_one.main([problem, cand, "--url", cpu_server, "--trials", "2"]) == code
    out = capsys.readouterr().out
    assert f"status: {status}" in out
    feedback = out.split("\n\nstatus:")[0]
    assert feedback.strip(), out  # the model's next user message comes first
    if status == "ok":
        assert "speedup: not measured" in out  # CPU worker: no timing


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem, cand = _files(tmp_path, "relu", "relu__correct")
    assert eval_one.main([problem, str(tmp_path / "missing.py"), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.py" in err[0]


def test_a_hanging_candidate_ends_at_the_timeout_with_a_waiting_line(
    cpu_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem, cand = _files(tmp_path, "relu", "relu__infinite_loop")
    assert eval_one.main([problem, cand, "--url", cpu_server, "--timeout-s", "3"]) == 14
    captured = capsys.readouterr()
    assert "evaluating relu__infinite_loop.py (at most 3 s)" in captured.err
    assert "status: timeout" in captured.out


def test_the_timeout_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem, cand = _files(tmp_path, "relu", "relu__correct")
    assert eval_one.main([problem, cand, "--url", "http://127.0.0.1:9", "--timeout-s", "0"]) == 2
    assert "--timeout-s must be > 0" in capsys.readouterr().err
