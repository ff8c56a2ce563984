"""One timing method per problem: the choice from the reference's recorded duration,
its boundary, the cache round trip, and the evaluator's use of it (reference and candidate on the
same method, escapes re-timed or rejected, never a switch of method).

time_gpu needs CUDA; here it is replaced by a recorder that returns scripted statistics, so the
evaluator's decisions are tested on their own (tests/gpu/test_timing_gpu.py times for real).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from eval_server.checks.runtime import GlobalStateSnapshot, NamespaceSnapshot
from eval_server.pipeline import timing_phase
from eval_server.pipeline.context import EvalContext, Reference
from eval_server.pipeline.loader import clone_args
from eval_server.pipeline.ref_cache import RefTimingCache
from eval_server.pipeline.timed_calls import copy_output
from eval_server.pipeline.timing import (
    BATCH_TRIAL_MS,
    MAX_CALLS_PER_TRIAL,
    METHOD_BATCHED,
    METHOD_SINGLE,
    SHORT_REFERENCE_MS,
    _calls,
    _per_call,
    calls_per_trial_for,
    method_name,
)
from eval_server.pipeline.verdicts import Stop
from eval_server.pipeline.verification import Guard
from eval_server.schema import STATUS_OK, STATUS_REJECTED, EvalOptions, EvalResult, TimingStats

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- the choice


def test_long_references_are_timed_one_call_per_trial():
    for ms in (SHORT_REFERENCE_MS, 0.0721, 1.0, 3.1, math.inf):
        assert calls_per_trial_for(ms) == 1


def test_boundary_just_below_the_threshold_is_batched():
    below = math.nextafter(SHORT_REFERENCE_MS, 0.0)
    assert calls_per_trial_for(SHORT_REFERENCE_MS) == 1
    k = calls_per_trial_for(below)
    assert k > 1 and k * below >= BATCH_TRIAL_MS and (k // 2) * below < BATCH_TRIAL_MS


@pytest.mark.parametrize("ms, k", [(0.004, 32), (0.002, 64), (0.008, 16), (0.03, 4), (0.0499, 4)])
def test_known_sizes(ms, k):
    assert calls_per_trial_for(ms) == k


def test_smallest_power_of_two_covering_the_trial_target():
    for i in range(1, 500):
        ms = i * 1e-4  # 0.1 us .. 50 us
        k = calls_per_trial_for(ms)
        assert k & (k - 1) == 0 and 2 <= k <= MAX_CALLS_PER_TRIAL
        assert k * ms >= BATCH_TRIAL_MS or k == MAX_CALLS_PER_TRIAL
        assert k == 2 or (k // 2) * ms < BATCH_TRIAL_MS


def test_same_duration_same_method_and_small_moves_keep_it():
    assert {calls_per_trial_for(0.004) for _ in range(100)} == {32}
    # the cached duration moving a few percent inside its power-of-two band keeps k
    assert calls_per_trial_for(0.0036) == calls_per_trial_for(0.004) == calls_per_trial_for(0.0046)


def test_choice_never_increases_with_duration():
    grid = [i * 1e-4 for i in range(1, 1000)]
    ks = [calls_per_trial_for(ms) for ms in grid]
    assert all(a >= b for a, b in zip(ks, ks[1:], strict=False))


@pytest.mark.parametrize("ms", [0.0, -1.0, math.nan])
def test_degenerate_durations_get_the_cap(ms):
    assert calls_per_trial_for(ms) == MAX_CALLS_PER_TRIAL


def test_method_names():
    assert method_name(1) == METHOD_SINGLE
    assert method_name(32) == METHOD_BATCHED


def test_per_call_divides_times_not_the_cv_or_trials():
    trial = TimingStats(
        median_ms=3.2, min_ms=3.0, mean_ms=3.3, iqr_ms=0.32, cv=0.01, trials=99, wall_median_ms=6.4,
        launch_median_ms=6.4, lead_ms=7.0, escaped_ms=0.64, escape_tail_ms=-0.32, escape_launch_ms=0.64,
        method=METHOD_BATCHED, calls_per_trial=32,
    )  # fmt: skip
    per = _per_call(trial, 32)
    assert per.median_ms == pytest.approx(0.1) and per.min_ms == pytest.approx(3.0 / 32)
    assert per.iqr_ms == pytest.approx(0.01) and per.launch_median_ms == pytest.approx(0.2)
    assert per.escaped_ms == pytest.approx(0.02) and per.wall_median_ms == pytest.approx(0.2)
    assert (per.escape_tail_ms, per.escape_launch_ms) == (pytest.approx(-0.01), pytest.approx(0.02))
    assert (per.cv, per.trials, per.lead_ms, per.calls_per_trial) == (0.01, 99, 7.0, 32)
    assert _per_call(trial, 1) is trial


def test_a_trial_calls_once_per_argument_list_and_keeps_a_copy_of_the_chosen_output():
    seen: list[int] = []
    out = torch.zeros(2)

    def fn(x: int) -> torch.Tensor:
        seen.append(x)
        out.fill_(x)  # the same buffer every call: only an immediate copy keeps call 1's values
        return out

    kept = _calls(fn, [[1], [2], [3]], keep=1)()
    assert seen == [1, 2, 3] and torch.equal(kept, torch.full((2,), 2.0)) and kept is not out
    assert _calls(fn, [[4]])() is None  # no call kept: nothing copied


def _stats(ms: float, calls: int = 1, escaped: float = 0.0, by_tail: bool = False) -> TimingStats:
    """Timing stats whose escape, if any, was seen by the launch check (or the tail check)."""
    seen, quiet = escaped or -0.01, -0.01
    return TimingStats(
        median_ms=ms, min_ms=ms, mean_ms=ms, iqr_ms=0.0, cv=0.0, trials=99, escaped_ms=escaped,
        escape_tail_ms=seen if by_tail else quiet, escape_launch_ms=quiet if by_tail else seen,
        method=method_name(calls), calls_per_trial=calls,
    )  # fmt: skip


def test_speedup_refuses_different_methods():
    assert timing_phase.speedup_ratio(_stats(0.004, 32), _stats(0.002, 32)) == pytest.approx(2.0)
    with pytest.raises(RuntimeError, match="not comparable"):
        timing_phase.speedup_ratio(_stats(0.004, 32), _stats(0.002, 1))
    # an escape no longer switches the comparison to other medians
    assert timing_phase.speedup_ratio(_stats(0.004, 32), _stats(0.002, 32, escaped=0.5)) == pytest.approx(2.0)


def test_cache_round_trip_keeps_the_method(tmp_path):
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    cache.put({"problem": "p"}, _stats(0.004, 32))
    cache.close()
    got = RefTimingCache(tmp_path / "ref.sqlite").get({"problem": "p"})
    assert got is not None and (got.method, got.calls_per_trial) == (METHOD_BATCHED, 32)


# ----------------------------------------------------------------------------- the evaluator


@dataclass
class FakeTimer:
    """Stands in for time_gpu: per-call medians by scripted value, escapes by a scripted queue;
    records (trials, calls_per_trial) of every timing and verifies one call per input set by
    really calling (into `verification.kept`, as time_gpu's verification trials do)."""

    per_call_ms: float
    escapes: list[float] = field(default_factory=list)
    calls: list[tuple[int, int]] = field(default_factory=list)
    min_trials: list[int | None] = field(default_factory=list)  # each timing's adaptive minimum

    def __call__(
        self, fn: Any, sets: Any, *, trials: int, calls_per_trial: int = 1, **kw: Any
    ) -> TimingStats:
        self.calls.append((trials, calls_per_trial))
        self.min_trials.append(kw.get("min_trials"))
        if kw.get("verification") is not None:
            for k, args in enumerate(sets):
                kw["verification"].kept.append((k, copy_output(fn(*clone_args(args)))))
        return _stats(self.per_call_ms, calls_per_trial, self.escapes.pop(0) if self.escapes else 0.0)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """An EvalContext on CPU tensors with a fake timer; `timer.per_call_ms` sets the reference's time."""
    timer = FakeTimer(per_call_ms=0.004)
    monkeypatch.setattr(timing_phase, "time_gpu", timer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    ctx = EvalContext(
        device=torch.device("cpu"),
        device_label="fake",
        workdir=tmp_path,
        timing_enabled=True,
        ref_cache=RefTimingCache(tmp_path / "ref.sqlite"),
    )
    ctx._flush = torch.empty(1)
    return timer, ctx


def _problem() -> Reference:
    module = types.ModuleType("problem")
    module.get_inputs = lambda: [torch.randn(8, 16)]  # type: ignore[attr-defined]
    seeds = [42, 43, 44, 45]
    return Reference(
        module=module, model=torch.nn.ReLU(), init_inputs=[], seeds=seeds[:3],
        precision=None, output_bytes=512, check_seeds=[45, 45],
    )  # fmt: skip


def _time_reference(ctx: EvalContext) -> EvalResult:
    result = EvalResult(status=STATUS_OK, problem_hash="abc")
    timing_phase.reference_timing(EvalOptions(), ctx, result, _problem())
    return result


def test_first_measurement_chooses_and_records_the_method(fake_gpu):
    timer, ctx = fake_gpu
    res = _time_reference(ctx)
    assert timer.calls == [(100, 1), (100, 32)]  # one call per trial, then the chosen method
    assert (res.reference_timing.method, res.reference_timing.calls_per_trial) == (METHOD_BATCHED, 32)
    assert "32 calls per trial" in res.reference_timing_source


def test_long_reference_is_measured_once(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms = 0.2
    res = _time_reference(ctx)
    assert timer.calls == [(100, 1)] and res.reference_timing.method == METHOD_SINGLE
    assert res.reference_timing_source == "measured"


def test_cached_method_is_kept_even_when_the_spot_check_would_choose_another(fake_gpu):
    timer, ctx = fake_gpu
    _time_reference(ctx)
    timer.calls.clear()
    res = _time_reference(ctx)  # same duration: a spot check by the cached method
    assert timer.calls == [(21, 32)] and res.reference_timing_source.startswith("spot check")
    timer.calls.clear()
    timer.per_call_ms = 0.2  # drifted far above the threshold: re-measured, method unchanged
    res = _time_reference(ctx)
    assert timer.calls == [(21, 32), (100, 32)] and res.reference_timing.calls_per_trial == 32
    assert res.reference_timing_source.startswith("remeasured")


def test_a_long_reference_that_drifted_is_remeasured_by_the_long_rule(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms = 2.0  # a 2 ms reference: long trials (Hardening.long_trial_ms)
    _time_reference(ctx)
    timer.calls.clear()
    timer.min_trials.clear()
    timer.per_call_ms = 2.5  # drifted: spot check, then the full re-measure
    res = _time_reference(ctx)
    assert res.reference_timing_source.startswith("remeasured")
    long = ctx.hardening.long_trial_trials
    assert timer.calls == [(long + 1, 1), (100, 1)] and timer.min_trials == [long, long]


def test_entry_from_before_the_method_field_is_not_used(fake_gpu, tmp_path):
    timer, ctx = fake_gpu
    _time_reference(ctx)
    old = {"median_ms": 0.004, "min_ms": 0.004, "mean_ms": 0.004, "iqr_ms": 0.0, "cv": 0.0, "trials": 99}
    with sqlite3.connect(tmp_path / "ref.sqlite") as conn:
        conn.execute("UPDATE ref_timing SET stats = ?", (json.dumps(old),))
    timer.calls.clear()
    res = _time_reference(ctx)
    assert timer.calls == [(100, 1), (100, 32)] and res.reference_timing_source.startswith("measured")


def _timing_checks(res: EvalResult) -> list:
    """The result's checks except the physics floor's (the fake GPU is in no table of peaks)."""
    return [c for c in res.checks if c.id != "runtime.physics_floor"]


def _time_candidate(ctx: EvalContext, ref_calls: int) -> EvalResult:
    ref = _problem()
    result = EvalResult(status=STATUS_OK, reference_timing=_stats(0.004, ref_calls))
    snapshot = Guard(NamespaceSnapshot([]), GlobalStateSnapshot())
    try:
        timing_phase.timing_phase(EvalOptions(), ctx, result, ref, torch.nn.ReLU(), snapshot)
    except Stop:
        pass
    return result


def test_candidate_is_timed_by_the_reference_method(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms = 0.002
    res = _time_candidate(ctx, 32)
    assert timer.calls == [(100, 32)]
    assert res.speedup == pytest.approx(2.0) and res.candidate_timing.calls_per_trial == 32
    assert _timing_checks(res) == []


def test_one_off_escape_is_retimed_on_the_same_method(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms, timer.escapes = 0.002, [0.05, 0.0]
    res = _time_candidate(ctx, 32)
    assert timer.calls == [(100, 32), (100, 32)]
    assert res.status == STATUS_OK and res.speedup == pytest.approx(2.0)
    assert [(c.id, c.severity) for c in _timing_checks(res)] == [("runtime.escaped_timing", "warn")]
    assert res.candidate_timing.escaped_ms == 0.0  # the clean re-timing is the one reported


def test_escape_twice_then_clean_is_reported_clean(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms, timer.escapes = 0.002, [0.05, 0.04, 0.0]
    res = _time_candidate(ctx, 1)
    assert timer.calls == [(100, 1)] * 3
    assert res.status == STATUS_OK and res.candidate_timing.escaped_ms == 0.0
    assert [(c.id, c.severity) for c in _timing_checks(res)] == [("runtime.escaped_timing", "warn")]


def test_repeated_escape_is_rejected(fake_gpu):
    timer, ctx = fake_gpu
    timer.per_call_ms, timer.escapes = 0.002, [0.05, 0.04, 0.03]
    res = _time_candidate(ctx, 1)
    assert timer.calls == [(100, 1)] * 3
    assert res.status == STATUS_REJECTED and res.speedup is None
    assert [(c.id, c.severity) for c in _timing_checks(res)] == [("runtime.escaped_timing", "reject")]
    # each timing's escaped time and the check that saw it, for the model and for diagnosis
    (check,) = _timing_checks(res)
    assert (
        "all 3 timings (0.05 ms per call by the launch check, 0.04 ms per call by the launch" in check.message
    )


def test_escape_summary_names_the_check_with_the_larger_excess():
    assert (
        timing_phase.escape_summary(_stats(0.002, escaped=0.003, by_tail=True))
        == "0.003 ms per call by the tail check"
    )
    assert (
        timing_phase.escape_summary(_stats(0.002, escaped=0.003)) == "0.003 ms per call by the launch check"
    )
    no_lead = dataclasses.replace(_stats(0.002, escaped=0.003, by_tail=True), escape_launch_ms=None)
    assert timing_phase.escape_summary(no_lead) == "0.003 ms per call by the tail check"
