"""eval_server.checks.close_kernel (the GPU's fused comparison) agrees with compare's torch path.

Runs tests/close_kernel_cases.py under TRITON_INTERPRET=1 in a subprocess (the switch is read
when triton is imported); bf16 is left to the GPU test (the interpreter's bf16 math is wrong).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kernel_matches_the_torch_path_on_every_case() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.close_kernel_cases", "cpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) >= 40
    assert [r for r in rows if r["torch"] != r["kernel"]] == []
    verdicts = {r["case"]: r["kernel"][0] for r in rows}
    assert verdicts["float32_4097_close"] and verdicts["float32_nan_both"] and verdicts["float32_inf_both"]
    assert not verdicts["float32_4097_one_far"] and not verdicts["float32_nan_candidate"]
    assert not verdicts["float16_inf_opposite"]
