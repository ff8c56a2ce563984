"""Where one forward's GPU time went (eval_server/pipeline/kernel_time.py): the split the
profiling-based reward scales by, its place in the result's JSON, and the feedback line."""

from __future__ import annotations

import pytest

from eval_server.feedback import build_feedback
from eval_server.pipeline.kernel_time import TOP_OTHERS, kernel_time
from eval_server.schema import EvalResult, KernelTime, TimingStats, ValidationError

pytestmark = pytest.mark.unit


def _own(name: str) -> bool:
    return name.startswith("relu_kernel")


def test_split_between_own_kernels_and_the_rest() -> None:
    times = [
        ("relu_kernel", 10.0),
        ("void at::native::direct_copy_kernel_cuda", 25.0),
        ("relu_kernel", 5.0),
        ("void at::native::direct_copy_kernel_cuda", 5.0),
        ("Memset (Device)", 3.0),
        ("void at::native::FillFunctor", 2.0),
        ("Memcpy DtoD", 1.0),
        ("clock artefact", -4.0),
    ]
    kt = kernel_time(times, _own)
    assert kt is not None
    assert kt.own_us == 15.0 and kt.total_us == 51.0 and kt.own_share == round(15 / 51, 4)
    # the rest summed by name, largest first, at most TOP_OTHERS of them
    assert [o["name"] for o in kt.others] == [
        "void at::native::direct_copy_kernel_cuda",
        "Memset (Device)",
        "void at::native::FillFunctor",
    ][:TOP_OTHERS]
    assert kt.others[0]["us"] == 30.0
    assert kernel_time([("relu_kernel", 2.0)], _own) == KernelTime(own_share=1.0, own_us=2.0, total_us=2.0)
    assert kernel_time([], _own) is None and kernel_time([("x", 0.0)], _own) is None


def test_result_json_round_trip_and_validation() -> None:
    r = EvalResult(status="ok", kernel_time=kernel_time([("relu_kernel", 3.0), ("copy", 1.0)], _own))
    back = EvalResult.from_json(r.to_json())
    assert back == r and back.kernel_time is not None and back.kernel_time.own_share == 0.75
    assert EvalResult.from_json(EvalResult(status="ok").to_json()).kernel_time is None
    bad = r.to_json()
    bad["kernel_time"]["own_fraction"] = 1.0
    with pytest.raises(ValidationError, match="result.kernel_time"):
        EvalResult.from_json(bad)


def _ok(kt: KernelTime | None) -> EvalResult:
    timing = TimingStats(median_ms=1.0, min_ms=1.0, mean_ms=1.0, iqr_ms=0.0, cv=0.0, trials=10)
    return EvalResult(
        status="ok",
        correct=True,
        speedup=1.1,
        reference_timing=timing,
        candidate_timing=timing,
        kernel_time=kt,
    )


def test_feedback_says_where_the_time_went() -> None:
    lazy = kernel_time([("relu_kernel", 10.0), ("void at::native::direct_copy_kernel_cuda", 30.0)], _own)
    text = build_feedback(_ok(lazy))
    assert "GPU time of one forward: 25% in your kernels (10 of 40 us)" in text
    assert "direct_copy_kernel_cuda 75%" in text and "Most of the time is not in your kernels" in text
    busy = build_feedback(_ok(kernel_time([("relu_kernel", 9.5), ("Memset (Device)", 0.5)], _own)))
    assert "95% in your kernels" in busy and "Most of the time" not in busy
    assert "GPU time of one forward" not in build_feedback(_ok(None))  # not profiled: nothing said
