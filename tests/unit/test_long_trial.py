"""Long problems (a reference trial of >= 1 ms) take fewer trials in the spot check and as the
candidate's adaptive minimum: the rule reads the problem's reference timing (trial = calls per
trial x per-call median), and the confidence-interval rule still stops a long but noisy timing
late."""

from __future__ import annotations

import pytest

from eval_server.isolation.hardening import Hardening
from eval_server.pipeline.timing_phase import adaptive_settings, long_trial
from eval_server.schema import TimingStats
from tests.unit.test_timing_adaptive import _Clock, _time


def _ref(median_ms: float, calls: int = 1) -> TimingStats:
    return TimingStats(
        median_ms=median_ms, min_ms=median_ms, mean_ms=median_ms, iqr_ms=0.0, cv=0.0, trials=20,
        calls_per_trial=calls,
    )  # fmt: skip


def test_a_trial_is_long_by_its_calls_times_the_median() -> None:
    hard = Hardening()
    assert long_trial(_ref(4.27), hard)  # KernelBench L1_19 ReLU on the H100
    assert long_trial(_ref(1.0), hard)
    assert not long_trial(_ref(0.714), hard)
    assert not long_trial(_ref(0.0026, calls=32), hard)  # a batched 2.6 us kernel: 0.083 ms trials
    assert long_trial(_ref(0.04, calls=32), hard)
    assert not long_trial(_ref(4.27), Hardening(long_trial_ms=5.0))


def test_long_problems_get_the_smaller_minimum_and_wider_interval_and_nothing_else_changes() -> None:
    hard = Hardening()
    short, long = adaptive_settings(hard, busy=True), adaptive_settings(hard, busy=True, long=True)
    assert (short["min_trials"], long["min_trials"]) == (20, 10)
    assert (short["ci_rel"], long["ci_rel"]) == (0.001, 0.005)
    changed = ("min_trials", "ci_rel")
    assert {k: v for k, v in short.items() if k not in changed} == {
        k: v for k, v in long.items() if k not in changed
    }
    assert adaptive_settings(Hardening(long_trial_ci_rel=0.0), long=True)["ci_rel"] == 0.0
    # The reference cache's key holds adaptive_settings(hard): entries written before stay hits.
    assert adaptive_settings(hard) == adaptive_settings(Hardening(long_trial_trials=5))


@pytest.mark.parametrize(
    "kwargs", [{"long_trial_trials": 1}, {"long_trial_ms": 0.0}, {"long_trial_ci_rel": -0.1}]
)
def test_hardening_rejects_unusable_long_trial_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="long_trial"):
        Hardening(**kwargs)  # type: ignore[arg-type]


def test_a_steady_long_kernel_stops_at_ten_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=4.3, noise=1e-3)  # +-0.1 % uniform: spread above what H100 trials show
    stats = _time(monkeypatch, clock, trials=100, **adaptive_settings(Hardening(), busy=True, long=True))
    assert stats.trials == 10
    assert stats.median_ms == pytest.approx(4.3, rel=1e-3)


def test_a_noisy_long_kernel_still_runs_until_its_median_is_tight(monkeypatch: pytest.MonkeyPatch) -> None:
    """+-2 % of spread: well past the minimum of 10 under the +-0.5 % interval (ten seeds; a
    one-call warm-up, so each seed's draws are the same on every machine)."""
    settings = {**adaptive_settings(Hardening(), busy=True, long=True), "min_warmup_ms": 0.0, "max_warmup_ms": 0.0}
    trials = [
        _time(monkeypatch, _Clock(kernel_ms=4.3, noise=0.02, seed=seed), trials=100, **settings).trials
        for seed in range(10)
    ]
    assert min(trials) > 2 * Hardening().long_trial_trials, trials


def test_a_long_kernel_with_a_few_tenths_of_a_percent_spread_stops_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """+-0.5 % of spread (GEMM on the H200 ran to 78 trials on average under the +-0.1 % rule): the
    long interval stops it near the minimum, the short one later (ten seeds; the warm-up is one
    call, so each seed's draws are the same on every machine)."""

    def trials(ci_rel: float, seed: int) -> tuple[int, float]:
        settings = {**adaptive_settings(Hardening(long_trial_ci_rel=ci_rel), busy=True, long=True)}
        settings.update(min_warmup_ms=0.0, max_warmup_ms=0.0)
        stats = _time(monkeypatch, _Clock(kernel_ms=3.0, noise=5e-3, seed=seed), trials=100, **settings)
        return stats.trials, stats.median_ms

    wide = [trials(0.005, seed) for seed in range(10)]
    strict = [trials(0.001, seed) for seed in range(10)]
    assert max(n for n, _ in wide) <= 12
    assert sum(n for n, _ in strict) > 3 * sum(n for n, _ in wide)
    assert all(m == pytest.approx(3.0, rel=5e-3) for _, m in wide)


def test_the_server_flag_sets_the_long_interval() -> None:
    from eval_server import __main__ as server_main

    args = server_main.build_parser().parse_args(["--long-trial-ci", "0.002"])
    assert Hardening(**server_main.hardening_overrides(args)).long_trial_ci_rel == 0.002
    default = server_main.build_parser().parse_args([])
    assert (
        Hardening(**server_main.hardening_overrides(default)).long_trial_ci_rel
        == Hardening().long_trial_ci_rel
    )
