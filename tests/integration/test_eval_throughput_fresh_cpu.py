"""bench/eval_throughput.py --fresh on the CPU (Triton's interpreter): the plumbing of the
fresh-candidate benchmark, and that each never-seen candidate gets the status its case must get
(a broken kernel included). Figures come from GPU runs, recorded in docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_fresh_candidates_get_their_statuses(tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    done = subprocess.run(
        [sys.executable, "bench/eval_throughput.py", "--fresh", "6", "--devices", "cpu", "--in-flight", "2",
         "--timeout-s", "120", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = json.loads(out.read_text()).values()
    assert result["evaluations"] == 6 and result["unexpected"] == []
    assert sum(result["statuses"].values()) == 6 and result["statuses"]["compile_error"] >= 2
    assert "judge_first_layer" in result["phase_mean_s"]
    assert 0 < result["workers_busy"] <= 1
    by_status = result["in_worker_s_by_status"]
    assert {k: v["n"] for k, v in by_status.items()} == result["statuses"]
    assert "workers busy" in done.stdout
