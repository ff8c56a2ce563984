"""A process that leaves its evaluation's group and outlives its parent is killed when the
evaluation ends (eval_server/isolation/sandbox.kill_strays, the worker), on the real CPU eval
server. The escape here is made by the problem's own code in the judge, which imports the problem
without the audit hook (a candidate's Python fork is refused; its native code is not audited):
a double fork into a new session, whose survivor writes its pid and sleeps."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest

from eval_server import samples
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

_ESCAPE = """import os as _os, time as _time
def _escape():
    if _os.fork() == 0:
        try:  # a forked copy never returns into the evaluator's code, whatever fails in it
            _os.setsid()
            if _os.fork() == 0:
                with open({pid_file!r} + ".tmp", "w") as _fh:
                    _fh.write(str(_os.getpid()))
                _os.rename({pid_file!r} + ".tmp", {pid_file!r})
                _time.sleep(120)
        finally:
            _os._exit(0)
try:
    _escape()
except Exception:  # the fork refused (the runner's audit hook); the judge's copy escapes
    pass
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_escaped_from_an_evaluation_does_not_outlive_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "stray.pid"
    body = {
        "reference": _ESCAPE.format(pid_file=str(pid_file)) + samples.load_problem("relu"),
        "candidate": samples.load_candidate("relu__correct"),
        "options": {"correctness_trials": 2},
    }
    with running_eval_server(tmp_path / "srv", "--devices", "cpu", "--cpu-workers", "1") as url:
        got = httpx.post(f"{url}/eval", json=body, timeout=600).json()
        assert got["status"] == "ok", got["feedback"]
        assert pid_file.exists(), "the problem's code did not escape: this test shows nothing"
        stray = int(pid_file.read_text())
        deadline = time.monotonic() + 60  # killed before the reply; reaped by the worker soon after
        while _alive(stray) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(stray)
