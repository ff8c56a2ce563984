"""How close a measured time came to the GPU's peaks (physics_floor.roofline, result.roofline):
the numbers, the result's JSON and the feedback line the optimizer role reads."""

from __future__ import annotations

import pytest

from eval_server.checks.physics_floor import peak_for, roofline
from eval_server.feedback import build_feedback
from eval_server.schema import EvalResult, Roofline, TimingStats, ValidationError

pytestmark = pytest.mark.unit


def test_achieved_throughput_against_the_peaks() -> None:
    h100 = peak_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    # KernelBench ReLU: 6.44 GB in + 6.44 GB out in 4.3 ms
    r = roofline(6_442_450_944, 6_442_450_944, 0, h100, 4300.0)
    assert r is not None and r["gbs"] == pytest.approx(2996.5, rel=1e-3)
    assert r["bandwidth_share"] == pytest.approx(2996.5 / h100.bandwidth_gbs, rel=1e-3)
    assert "tflops" not in r  # no counted FLOPs
    gemm = roofline(1024 * 8192 * 4 * 2 + 8192 * 8192 * 4, 1024 * 8192 * 4, 2 * 1024 * 8192 * 8192, h100, 1850.0)
    assert gemm is not None and gemm["tflops"] == pytest.approx(74.3, rel=1e-2)
    assert gemm["compute_share"] == pytest.approx(74.3 / h100.tensor_tflops, rel=1e-2)
    assert roofline(0, 0, 0, h100, 10.0) is None and roofline(8, 8, 0, h100, 0.0) is None


def test_result_json_and_feedback() -> None:
    t = TimingStats(median_ms=4.3, min_ms=4.3, mean_ms=4.3, iqr_ms=0.0, cv=0.0, trials=10)
    line = Roofline(device="H100 SXM", gbs=2996.5, bandwidth_share=0.8945, tflops=None, compute_share=None)
    r = EvalResult(status="ok", correct=True, compiled=True, speedup=0.99, reference_timing=t,
                   candidate_timing=t, roofline=line)  # fmt: skip
    assert EvalResult.from_json(r.to_json()) == r
    text = build_feedback(r)
    assert "Throughput: 2996 GB/s, 89% of the H100 SXM's peak memory bandwidth" in text
    bad = r.to_json()
    bad["roofline"]["percent"] = 1
    with pytest.raises(ValidationError, match="result.roofline"):
        EvalResult.from_json(bad)
    assert "Throughput" not in build_feedback(EvalResult(status="ok", correct=True, compiled=True))
