"""Throughput changes on a real GPU: the one-sync comparison agrees with element-wise isclose on a KernelBench-sized output, and
KernelBench's own harness runs one of its problems through bench/kernelbench_eval.py (when a
checkout is at third_party/KernelBench or $KERNELBENCH_DIR).

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_eval_throughput_gpu.py -v`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server.checks import compare  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEVICE = torch.device("cuda", 0)


def test_one_sync_comparison_matches_isclose_on_a_large_output() -> None:
    ref = torch.rand(4096, 65536, device=DEVICE)
    cand = ref + 1e-3 * torch.randn_like(ref)
    cand[17, 4242] += 1.0
    ok, max_abs, _ = compare._tensor_close(ref, cand, 1e-2)
    assert not bool(torch.isclose(cand, ref, rtol=1e-2, atol=1e-2).all())
    assert ok is False
    assert max_abs == pytest.approx(float((cand - ref).abs().max()))
    assert compare._tensor_close(ref, ref.clone(), 1e-2) == (True, 0.0, 0.0)


def _kernelbench_dir() -> Path | None:
    root = Path(os.environ.get("KERNELBENCH_DIR", REPO / "third_party" / "KernelBench"))
    return root if (root / "src" / "kernelbench" / "eval.py").is_file() else None


@pytest.mark.skipif(_kernelbench_dir() is None, reason="no KernelBench checkout (third_party/KernelBench)")
def test_kernelbench_harness_evaluates_our_gemm_candidate() -> None:
    root = _kernelbench_dir()
    assert root is not None
    cmd = [
        sys.executable,
        str(REPO / "bench" / "kernelbench_eval.py"),
        "--kernelbench", str(root),
        "--problem", str(root / "KernelBench" / "level2" / "12_Gemm_Multiply_LeakyReLU.py"),
        "--candidate", str(REPO / "bench" / "candidates" / "gemm_scale_leakyrelu_large__triton.py"),
        "--perf-trials", "20",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compiled"] and out["correct"], (out, proc.stderr[-2000:])
    assert out["speedup"] > 0 and out["runtime_ms"] > 0
