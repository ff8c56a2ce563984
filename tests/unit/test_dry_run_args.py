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
