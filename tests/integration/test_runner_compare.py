"""The candidate's process compares outputs with torch ops, as its judge does: the fused
comparison kernel (checks/close_kernel.py) would be loaded from the Triton cache that the
worker's earlier candidates could write, and a replaced binary would make later honest
candidates fail their checks. Real CPU eval server; the probe is printed by the reference, which
the runner imports (as evaluator code) after its first layer has started."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from eval_server import samples
from eval_server.checks import compare
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

_PROBE = """from eval_server.checks import compare as _compare
print("FUSED", _compare._close_kernel is not None)
"""


def test_the_runner_never_uses_the_fused_comparison_kernel(tmp_path: Path) -> None:
    assert compare._close_kernel is not None, "no Triton here: the probe would show nothing"
    body = {
        "reference": _PROBE + samples.load_problem("relu"),
        "candidate": samples.load_candidate("relu__correct"),
        "options": {"correctness_trials": 2},
    }
    with running_eval_server(tmp_path / "srv", "--devices", "cpu", "--cpu-workers", "1") as url:
        got = httpx.post(f"{url}/eval", json=body, timeout=600).json()
    assert got["status"] == "ok", got["feedback"]
    assert "FUSED False" in got["stdout_tail"], got["stdout_tail"]
