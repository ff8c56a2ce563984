"""No reference output exists while candidate code runs, on GPU with timing: the probe of
tests/reference_probe.py also looks before every timed call and the refill checks' calls.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_reference_unreachable_gpu.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("leak", [False, True], ids=["evaluator", "control-keeps-outputs"])
def test_no_reference_output_is_alive_when_candidate_code_runs(leak: bool) -> None:
    args = [sys.executable, "-m", "tests.reference_probe", "--device", "cuda"] + (["--leak"] if leak else [])
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["status"] == "ok", res["feedback"]
    assert res["looks"] > 1 + 5 + 20, res  # import, correctness, timing (warm-up and trials), refill
    if leak:
        assert res["found"], res
    else:
        assert res["found"] == [], res["found"]
