"""bench/escape_after_failure.py on CPU: the predecessors get their failing statuses, each small
kernel's evaluation is recorded after them, and the rows count warnings and rejections."""

from __future__ import annotations

import json

import pytest

from bench import escape_after_failure as bench
from eval_server.schema import Check, EvalResult, TimingStats


def _result(
    status: str, severity: str | None = None, tail: float = -0.01, launch: float = -0.02
) -> EvalResult:
    checks = (
        [Check("runtime.escaped_timing", "0.003 ms per call by the launch check", severity)]
        if severity
        else []
    )
    timing = None
    if status == "ok":
        timing = TimingStats(0.002, 0.002, 0.002, 0.0, 0.0, 40, escape_tail_ms=tail, escape_launch_ms=launch)
    return EvalResult(
        status=status,
        checks=checks,
        candidate_timing=timing,
        speedup=1.0 if status == "ok" else None,
        phases={"spare_wait": 0.5, "timing": 0.2, "correctness": 0.3},
    )


def test_rows_count_warnings_rejections_and_keep_configs_apart() -> None:
    recs = [
        bench.record_of("{}", "syntax_error", 0, "compile_error", _result("ok")),
        bench.record_of("{}", "syntax_error", 1, "compile_error", _result("ok", "warn")),
        bench.record_of("{}", "syntax_error", 2, "compile_error", _result("rejected", "reject")),
        bench.record_of('{"escape_retimes": 3}', "syntax_error", 0, "compile_error", _result("ok")),
    ]
    assert recs[0].phases == {"spare_wait": 0.5, "timing": 0.2}  # only the phases that explain
    assert (recs[0].escape_tail_ms, recs[0].escape_launch_ms) == (-0.01, -0.02)
    assert recs[2].escape_tail_ms is None and recs[2].escape == "reject"
    first, second = bench.summarize(recs)
    assert (first.n, first.ok, first.warned, first.rejected) == (3, 2, 1, 1)
    assert first.speedup_mean == pytest.approx(1.0) and first.timing_mean == pytest.approx(0.2)
    assert (second.config, second.n, second.warned) == ('{"escape_retimes": 3}', 1, 0)
    assert "syntax_error" in bench.table([first, second])


def test_predecessors_are_the_documented_failures() -> None:
    assert bench.predecessor("none") is None
    assert "def forward" in bench.predecessor("illegal_address").candidate
    with pytest.raises(KeyError):
        bench.predecessor("nope")


def test_cpu_run_records_each_kind_after_its_failing_predecessor(tmp_path) -> None:
    out = tmp_path / "esc.json"
    rc = bench.main(
        ["--devices", "cpu", "--rounds", "1", "--kinds", "none,syntax_error,segfault",
         "--hardening", '{"escape_retimes": 3}', "--json", str(out), "--workdir", str(tmp_path / "w")]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    before = {r["kind"]: r["before_status"] for r in data["records"]}
    assert before == {"none": None, "syntax_error": "compile_error", "segfault": "crashed"}
    assert all(r["status"] == "ok" for r in data["records"])
    assert [r["kind"] for r in data["rows"]] == ["none", "syntax_error", "segfault"]


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown"):
        bench.main(["--kinds", "none,typo"])
