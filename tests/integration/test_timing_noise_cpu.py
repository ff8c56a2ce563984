"""bench/timing_noise.py end to end on CPU: a real worker pool (Triton interpreter), a worker
restart and a crashing candidate between rounds; no timing there, which the script must say
(exit 2) instead of reporting a CV of nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_cpu_run_evaluates_through_restart_and_crash_and_says_it_cannot_time(tmp_path):
    out = tmp_path / "noise.json"
    cmd = [sys.executable, "bench/timing_noise.py", "--devices", "cpu", "--repeats", "3", "--pause-s", "0",
           "--restart-at", "1", "--crash-at", "2", "--cases", "relu_large:64x1000", "--json", str(out)]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "NO TIMING" in res.stdout and "round 2: crashing candidate -> crashed" in res.stdout
    restarted = re.search(r"^round 1: worker restarted \(pid (\d+) -> (\d+)\)$", res.stdout, re.MULTILINE)
    assert restarted and restarted[1] != restarted[2], res.stdout
    report = json.loads(out.read_text())
    assert [r["tags"] for r in report["records"]] == [["first"], ["after-restart"], ["after-crash"]]
    assert all(r["status"] == "ok" and r["speedup"] is None for r in report["records"])
    (row,) = report["rows"]
    assert (row["n"], row["ok"], row["timed"], row["speedup_cv"]) == (3, 3, 0, None)
    assert report["failures"] == []
