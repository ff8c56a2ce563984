"""tools/dry_run.py refuses bad arguments before it installs, builds or starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import dry_run

pytestmark = pytest.mark.unit


def test_unknown_problem_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dry run got past argument checking")

    monkeypatch.setattr(dry_run, "ensure_requirements", must_not_run)
    monkeypatch.setattr(dry_run, "launch", must_not_run)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        dry_run.main(["--problems", "relu", "nosuch", "--run-dir", str(run_dir)])
    assert exited.value.code == 2  # a usage error, as argparse reports them
    err = capsys.readouterr().err
    assert "unknown sample problem(s) nosuch; bundled: " in err and "relu" in err
    assert not run_dir.exists()


class _GoneReader:
    """stderr whose reader is gone: Ctrl-C in a terminal also ends `| tee log`."""

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_ctrl_c_stops_the_run_even_when_its_output_pipe_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from slime_ext.dev_engine import tiny_model

    stopped: list[Path] = []

    def interrupted_launch(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the launcher starts the session (step 3/4)

    monkeypatch.setattr(dry_run, "ensure_requirements", lambda install: None)
    monkeypatch.setattr(tiny_model, "write_model_dir", lambda path: path)
    monkeypatch.setattr(dry_run, "launch", interrupted_launch)
    monkeypatch.setattr(dry_run, "stop", lambda run_dir, env: stopped.append(run_dir))
    monkeypatch.setattr(sys, "stderr", _GoneReader())
    run_dir = tmp_path / "run"
    assert dry_run.main(["--no-install", "--problems", "relu", "--run-dir", str(run_dir)]) == 130
    assert stopped == [run_dir.resolve()]


def test_a_run_stopped_from_outside_is_reported_as_stopped_not_failed(tmp_path: Path) -> None:
    """scripts/stop.sh ends the trainer window with SIGTERM (exit code 143): the dry run says the
    run was stopped, not that the rollout step failed."""
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "trainer.rc").write_text("143\n")
    with pytest.raises(dry_run.RunStopped, match="stopped from outside"):
        dry_run.wait_for_step(tmp_path, timeout_s=5)
    (tmp_path / "pids" / "trainer.rc").write_text("1\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trainer.log").write_text("Traceback: boom\n")
    with pytest.raises(dry_run.DryRunError, match="exit code 1"):
        dry_run.wait_for_step(tmp_path, timeout_s=5)
