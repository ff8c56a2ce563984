"""bench/eval_under_load.py's plumbing on CPU workers: server, load processes, honest corpus,
summary (its GPU run is the measurement; docs/GPU_TESTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from bench import eval_under_load

pytestmark = pytest.mark.integration


def test_honest_samples_under_cpu_load_are_all_ok(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code = eval_under_load.main(
        [
            "--devices",
            "cpu",
            "--evals",
            "3",
            "--cpu-load",
            "1",
            "--server-args",
            "--cpu-workers 1",
            "--out",
            str(out),
        ]
    )
    summary = json.loads(out.read_text())
    assert code == 0 and summary["false_rejections"] == 0 and summary["statuses"] == {"ok": 3}
    assert summary["load"]["cpu_processes"] == 1
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # load stopped
