"""No reference output exists while candidate code runs (evaluate.py): tests/reference_probe.py
evaluates an honest candidate on CPU and looks for reference outputs (alive, aliased, or their
bytes in any live tensor) before the candidate's import and before each of its calls. A control
run that keeps the outputs alive shows the probe finds them. (Before this order, the probe found
all six reference outputs alive at the candidate's import.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _probe(*args: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reference_probe", "--device", "cpu", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_reference_output_is_reachable_when_candidate_code_runs() -> None:
    res = _probe()
    assert res["status"] == "ok", res["feedback"]
    assert res["looks"] == 1 + 5, res  # the import and five correctness calls
    assert res["recorded"] >= 1 + 5, res  # the reference phase's output and one per trial
    assert res["found"] == [], res["found"]


def test_the_probe_finds_reference_outputs_kept_alive() -> None:
    res = _probe("--leak")
    assert res["status"] == "ok", res["feedback"]
    assert any(f.startswith("candidate import: reference output") for f in res["found"]), res
    assert any("holds a reference output's bytes" in f for f in res["found"]), res
