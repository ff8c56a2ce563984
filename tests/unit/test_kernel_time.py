"""Where one forward's GPU time went (eval_server/pipeline/kernel_time.py): the split the
profiling-based reward scales by, its place in the result's JSON, and the feedback line."""

from __future__ import annotations

import pytest

from eval_server.feedback import build_feedback
from eval_server.pipeline.kernel_time import TOP_OTHERS, kernel_time, reference_kernels, with_reference
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


def test_the_reference_forward_is_summarised_and_shown_beside_the_candidates() -> None:
    """The reference's profiled forward (once per problem and device, with its cached facts):
    its device time and largest activities, the first its bottleneck, in the result and the
    feedback."""
    ref = reference_kernels(
        [("ampere_sgemm_128x64_nn", 80.0), ("void at::native::vectorized_elementwise_kernel", 15.0),
         ("ampere_sgemm_128x64_nn", 20.0), ("Memset (Device)", 5.0), ("clock artefact", -1.0)]
    )  # fmt: skip
    assert ref == {
        "total_us": 120.0,
        "top": [
            {"name": "ampere_sgemm_128x64_nn", "us": 100.0},
            {"name": "void at::native::vectorized_elementwise_kernel", "us": 15.0},
            {"name": "Memset (Device)", "us": 5.0},
        ],
    }
    assert reference_kernels([]) is None
    kt = with_reference(kernel_time([("relu_kernel", 40.0)], _own), ref)
    assert kt is not None and kt.reference_us == 120.0 and kt.reference_top[0]["us"] == 100.0
    assert kt.own_us == 40.0  # the candidate's own split is unchanged
    assert EvalResult.from_json(_ok(kt).to_json()).kernel_time == kt
    text = build_feedback(_ok(kt))
    assert "The reference's forward: 120 us, 83% of it in ampere_sgemm_128x64_nn (its bottleneck)." in text
    assert with_reference(None, ref) is None
    assert with_reference(kernel_time([("relu_kernel", 1.0)], _own), None).reference_us is None


def test_reference_facts_keep_the_profile_through_the_cache(tmp_path) -> None:
    from eval_server.pipeline.ref_cache import RefTimingCache
    from eval_server.pipeline.reference import _Facts

    facts = _Facts(precision=None, output_bytes=8, input_bytes=8, flops=0, kernels=reference_kernels([("k", 2.0)]))
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    cache.put_facts({"problem": "p"}, facts.to_json())
    cache.close()
    back = _Facts.from_json(RefTimingCache(tmp_path / "ref.sqlite").get_facts({"problem": "p"}))
    assert back == facts and back.kernels == {"total_us": 2.0, "top": [{"name": "k", "us": 2.0}]}
