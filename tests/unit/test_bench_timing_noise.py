"""bench/timing_noise.py's bookkeeping: per-case summary, CV, the pass/fail rule and the table
(the timing itself needs a GPU; tests/integration/test_timing_noise_cpu.py runs the script on CPU)."""

from __future__ import annotations

import statistics

import pytest

from bench import timing_noise as tn
from bench.corpus import size_constants
from eval_server.schema import STATUS_OK, TimingStats

pytestmark = pytest.mark.unit


def rec(case: str, speedup: float | None, *, status: str = STATUS_OK, method: str | None = "gpu-time x1",
        tags: list[str] | None = None, checks: list[str] | None = None, rnd: int = 0) -> tn.Record:  # fmt: skip
    timed = speedup is not None
    return tn.Record(
        case=case, round=rnd, tags=tags or [], status=status, speedup=speedup,
        method=method if timed else None, reference_ms=0.004 if timed else None,
        candidate_ms=0.004 / speedup if timed else None, checks=checks or [],
    )  # fmt: skip


def test_cv_is_population_std_over_mean():
    assert tn.cv([1.0, 1.0, 1.0]) == 0.0
    assert tn.cv([0.9, 1.1]) == pytest.approx(0.1)
    assert tn.cv([2.0]) == 0.0 and tn.cv([]) == 0.0


def test_an_infinite_speedup_is_an_infinite_cv_not_a_crash():
    assert tn.cv([float("inf"), 1.0]) == float("inf")
    assert tn.failures(tn.summarize([rec("a", float("inf")), rec("a", 1.0)]), 0.02)


def test_summary_per_case_in_first_seen_order():
    records = [
        rec("b", 1.0, tags=["first"]),
        rec("a", 2.0, tags=["first"]),
        rec("b", 1.02, tags=["after-restart"], rnd=1),
        rec("a", 2.0, rnd=1),
        rec("b", 0.98, tags=["after-crash"], checks=["runtime.escaped_timing"], rnd=2),
    ]
    b, a = tn.summarize(records)
    assert (b.case, a.case) == ("b", "a")
    assert (b.n, b.ok, b.timed, b.escaped) == (3, 3, 3, 1)
    assert b.speedup_mean == pytest.approx(1.0)
    assert b.speedup_cv == pytest.approx(statistics.pstdev([1.0, 1.02, 0.98]))
    assert (b.speedup_min, b.speedup_max) == (0.98, 1.02)
    assert b.tagged == {"first": 1.0, "after-restart": 1.02, "after-crash": 0.98}
    assert b.methods == ["gpu-time x1"]
    assert a.speedup_cv == 0.0 and a.candidate_ms == pytest.approx(0.002)


def test_issue16_series_fails_on_cv_and_the_method_switch():
    """The H200 series recorded in docs/BENCHMARKS.md, as two methods would have reported it."""
    series = [0.47, 0.53, 0.59, 0.66, 1.01, 1.04, 1.05, 1.05]
    records = [rec("relu", s, method="launch x1" if s < 0.9 else "gpu-time x1") for s in series]
    (row,) = tn.summarize(records)
    problems = tn.failures([row], max_cv=0.02)
    assert any("more than one method" in p for p in problems)
    assert any("speedup CV" in p for p in problems)


def test_cv_boundary_and_not_ok_and_untimed():
    steady = tn.summarize([rec("x", 1.0), rec("x", 1.04)])  # CV 1.96 %
    assert steady[0].speedup_cv == pytest.approx(0.0196, abs=1e-4)
    assert tn.failures(steady, 0.02) == []
    assert tn.failures(steady, 0.019)
    broken = tn.summarize([rec("y", 1.0), rec("y", None, status="crashed")])
    assert tn.failures(broken, 0.02) == ["y: 1 of 2 evaluations not ok ({'ok': 1, 'crashed': 1})"]
    partly = tn.summarize([rec("z", 1.0), rec("z", None)])  # ok but without timing
    assert tn.failures(partly, 0.02) == ["z: 1 correct evaluations without timing"]
    cpu = tn.summarize([rec("c", None), rec("c", None)])  # a CPU run: nothing timed, no failure
    assert tn.failures(cpu, 0.02) == [] and cpu[0].speedup_cv is None


def test_table_has_a_row_per_case_and_dashes_for_missing_values():
    rows = tn.summarize([rec("relu_large:64x1000", 1.0, tags=["after-restart"]), rec("cpu", None)])
    lines = tn.format_table(rows).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["case", "n", "ok"]
    assert lines[1].split()[3] == "gpu-time" and "1.000" in lines[1]
    assert len(lines[2]) == len(lines[1])  # dashes keep the columns aligned
    assert lines[2].split()[3:8] == ["-"] * 5


def test_record_of_reads_method_and_medians():
    from eval_server.schema import EvalResult

    def stats(ms: float) -> TimingStats:
        return TimingStats(ms, ms, ms, 0.0, 0.0, 99, method="gpu-time-batched", calls_per_trial=32)

    res = EvalResult(
        status=STATUS_OK, reference_timing=stats(0.004), candidate_timing=stats(0.002), speedup=2.0
    )
    r = tn.record_of("c", 3, ["after-crash"], res)
    assert (r.method, r.speedup, r.reference_ms, r.candidate_ms) == (
        "gpu-time-batched x32",
        2.0,
        0.004,
        0.002,
    )


def test_cases_build_valid_requests_and_selection():
    labels = [c.label for c in tn.CASES]
    assert len(set(labels)) == len(labels) and "relu_large:64x1000" in labels
    for case in tn.CASES:
        req = case.request()
        assert "class ModelNew" in req.candidate
        for name, value in case.sizes:
            assert size_constants(req.reference)[name] == value
    assert tn.select_cases("relu_large:64x1000")[0].sizes == (("BATCH", 64), ("DIM", 1000))
    with pytest.raises(SystemExit, match="unknown"):
        tn.select_cases("relu_large:1x1")
