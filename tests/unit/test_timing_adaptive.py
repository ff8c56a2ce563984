"""time_gpu's trial schedule (fixed and adaptive) on a simulated device clock, and the median's
confidence interval that decides when adaptive timing stops. The CUDA entry points timing.py
binds at import are replaced by a clock that kernels, GPU delays and events share."""

from __future__ import annotations

import math
import random

import pytest
import torch

from eval_server.pipeline import timing


class _Clock:
    """One stream: every call queues work that ends at `now`; events read `now`."""

    def __init__(
        self, kernel_ms: float, noise: float, seed: int = 0, ramp: float = 0.0, ramp_calls: float = 1.0
    ) -> None:
        self.now = 0.0
        self.kernel_ms, self.noise = kernel_ms, noise
        self.ramp, self.ramp_calls = (
            ramp,
            ramp_calls,
        )  # clocks coming up: slower by ramp * exp(-calls / ramp_calls)
        self.rng = random.Random(seed)
        self.kernel_calls = 0
        # the host's wake-up in a synchronize that waited for at least wake_after_ms of queued
        # work (none for less), and work on another stream the next synchronize waits for
        self.wake_ms, self.wake_after_ms, self.side_ms = 0.0, 0.001, 0.0
        self.queued_ms, self.side_pending = 0.0, 0.0

    def kernel_ms_now(self) -> float:
        return self.kernel_ms * (1 + self.ramp * math.exp(-self.kernel_calls / self.ramp_calls))

    def kernel(self, *_args: object) -> torch.Tensor:
        self.now += self.kernel_ms_now() * (1 + self.noise * self.rng.uniform(-1, 1))
        self.kernel_calls += 1
        self.queued_ms += self.kernel_ms
        self.side_pending += self.side_ms
        return torch.zeros(1)

    def synchronize(self, *_args: object) -> None:
        self.now += self.side_pending + (self.wake_ms if self.queued_ms >= self.wake_after_ms else 0.0)
        self.queued_ms, self.side_pending = 0.0, 0.0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        clock = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = 0.0

            def record(self) -> None:
                self.t = clock.now

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                return end.t - self.t

        def sleep(cycles: int) -> None:
            clock.now += cycles / 1e6  # 1e6 cycles per ms
            clock.queued_ms += cycles / 1e6

        monkeypatch.setattr(timing, "_Event", Event)
        monkeypatch.setattr(timing, "_synchronize", clock.synchronize)
        monkeypatch.setattr(timing, "_gpu_sleep", sleep)
        monkeypatch.setitem(timing._cycles_per_ms, 0, 1e6)


def _time(monkeypatch: pytest.MonkeyPatch, clock: _Clock, **kwargs: object) -> timing.TimingStats:
    clock.install(monkeypatch)
    return timing.time_gpu(
        clock.kernel,
        [[], [], []],
        warmup=1,
        device=torch.device("cuda", 0),
        flush=torch.empty(4),
        **{"min_warmup_ms": 0.0, **kwargs},  # type: ignore[arg-type]
    )


def test_fixed_count_is_unchanged_without_adaptive_options(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    stats = _time(monkeypatch, clock, trials=100)
    # 100 lead-timed trials (first discarded) + one check trial per three: 133 timed calls.
    assert stats.trials == 99
    assert clock.kernel_calls - stats.warmup_calls == 133
    assert stats.median_ms == pytest.approx(1.0)


def test_adaptive_stops_at_the_minimum_when_the_median_is_tight(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=3.0, noise=1e-4)
    stats = _time(monkeypatch, clock, trials=100, min_trials=20, ci_rel=1e-3)
    assert stats.trials == 20
    assert timing.median_ci_rel([3.0] * 20) == 0.0
    assert stats.median_ms == pytest.approx(3.0, rel=1e-3)


def test_adaptive_runs_to_the_maximum_when_noise_keeps_the_interval_wide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock(kernel_ms=0.01, noise=0.2)
    stats = _time(monkeypatch, clock, trials=100, min_trials=20, ci_rel=1e-3)
    assert stats.trials == 99


def test_adaptive_stops_in_between_for_moderate_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=1.0, noise=0.01)  # uniform +-1 %: ~0.58 % CV
    stats = _time(monkeypatch, clock, trials=1000, min_trials=20, ci_rel=1e-3)
    assert 20 < stats.trials < 999


def test_at_least_two_check_trials_even_for_two_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    stats = _time(monkeypatch, clock, trials=2)
    assert stats.trials == 1 and stats.launch_median_ms is not None
    assert clock.kernel_calls - stats.warmup_calls == 4


def test_median_ci_rel() -> None:
    assert timing.median_ci_rel([1.0]) == float("inf")
    assert timing.median_ci_rel([2.0, 2.0, 2.0]) == 0.0
    xs = [1.0 + i / 100 for i in range(100)]  # 1.00 .. 1.99, median 1.495
    # order statistics 50 -+ 9.8: the 41st and 60th values (0-based 40 and 59)
    assert timing.median_ci_rel(xs) == pytest.approx((1.59 - 1.40) / (2 * 1.495))
    wide = timing.median_ci_rel([1.0, 1.5, 2.0, 2.5, 3.0])
    assert wide == pytest.approx((3.0 - 1.0) / (2 * 2.0))


def test_warm_up_stops_once_a_warm_gpu_has_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant per-call time: the warm-up calls, then the settling windows, and no more."""
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    stats = _time(monkeypatch, clock, trials=20, max_warmup_ms=60_000.0)
    # 1 warm-up call, a first window of 1 call, then windows of WARMUP_WINDOW_MS (5 calls of 1 ms)
    assert stats.warmup_calls == 1 + 1 + 5 * (timing.WARMUP_SETTLED_WINDOWS - 1)
    assert stats.warmup_ms is not None and stats.warmup_ms < 60_000.0


def test_warm_up_runs_until_the_clocks_are_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-call time falling as clocks come up (50 % slower at first, e-folding over 20 calls of
    1 ms): the warm-up goes on while successive windows disagree, so what is timed is (within the
    settle tolerance's reach) the warm kernel. Windows span ~10 ms: a drift much slower than that
    is not what this detects; a GPU that may have idled gets the full warm-up instead."""
    clock = _Clock(kernel_ms=1.0, noise=0.0, ramp=0.5, ramp_calls=20.0)
    stats = _time(monkeypatch, clock, trials=20, max_warmup_ms=60_000.0)
    assert stats.warmup_calls is not None and stats.warmup_calls > 40
    assert stats.median_ms == pytest.approx(1.0, rel=0.01)


def test_warm_up_is_cut_at_its_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-call time that never settles (it jumps by 5 % every 7 calls): the warm-up ends at
    max_warmup_ms."""
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    clock.kernel_ms_now = lambda: 1.0 + 0.05 * ((clock.kernel_calls // 7) % 2)  # type: ignore[method-assign]
    stats = _time(monkeypatch, clock, trials=20, max_warmup_ms=30.0)
    assert stats.warmup_ms is not None and stats.warmup_ms >= 30.0


def test_fixed_warm_up_when_minimum_equals_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    stats = _time(monkeypatch, clock, trials=20, min_warmup_ms=40.0, max_warmup_ms=40.0)
    assert stats.warmup_ms is not None and stats.warmup_ms >= 40.0


def test_warm_up_bounds_must_be_ordered(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="min_warmup_ms"):
        _time(
            monkeypatch, _Clock(kernel_ms=1.0, noise=0.0), trials=20, min_warmup_ms=50.0, max_warmup_ms=10.0
        )


def test_settled() -> None:
    assert not timing.settled([1.0, 1.0])  # too few windows
    assert timing.settled([5.0, 1.0, 1.005, 1.0])
    assert not timing.settled([1.0, 1.02, 1.0])
    assert not timing.settled([0.0, 0.0, 0.0])  # no time measured is not a settled kernel


def test_no_warm_up_asked_still_makes_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """warmup 0 and a zero warm-up time (both allowed): one call, whose host time sets the lead."""
    clock = _Clock(kernel_ms=1.0, noise=0.0)
    clock.install(monkeypatch)
    stats = timing.time_gpu(
        clock.kernel, [[]], trials=5, warmup=0, device=torch.device("cuda", 0), flush=torch.empty(4),
        min_warmup_ms=0.0, max_warmup_ms=0.0,
    )  # fmt: skip
    assert stats.warmup_calls == 1 and stats.lead_ms is not None


def test_warm_up_of_a_noisy_microsecond_kernel_settles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 us kernel with +-20 % noise per call: windows of up to WARMUP_WINDOW_CALLS calls
    average the noise out, so the warm-up settles instead of running to its maximum."""
    clock = _Clock(kernel_ms=0.002, noise=0.2)
    stats = _time(monkeypatch, clock, trials=20, max_warmup_ms=60_000.0)
    assert stats.warmup_calls is not None and stats.warmup_calls < 20 * timing.WARMUP_WINDOW_CALLS


def _margin(trial_ms: float) -> float:
    return timing.ESCAPE_MARGIN_MS + timing.ESCAPE_MARGIN_FRACTION * trial_ms


def test_a_slow_wake_from_the_synchronize_is_not_escaped_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host wakes 60 us after the GPU finished, in every synchronize that waited: beyond the
    margin over a bare synchronize and a 1-cycle kernel's (which return at once), but the
    control trials and kernels wait too."""
    clock = _Clock(kernel_ms=0.08, noise=0.0)
    clock.wake_ms = 0.06
    assert clock.wake_ms > _margin(0.08)
    stats = _time(monkeypatch, clock, trials=40)
    assert stats.escaped_ms == 0.0
    assert stats.escape_tail_ms == pytest.approx(-_margin(0.08))
    assert stats.escape_launch_ms is not None and stats.escape_launch_ms < 0


def test_work_the_synchronize_waits_for_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.2 ms of another stream's work after each call: both checks see it, whatever the wake-up."""
    for wake in (0.0, 0.06):
        clock = _Clock(kernel_ms=0.08, noise=0.0)
        clock.wake_ms, clock.side_ms = wake, 0.2
        stats = _time(monkeypatch, clock, trials=40)
        assert stats.escape_tail_ms == pytest.approx(0.2 - _margin(0.08))
        assert stats.escaped_ms == pytest.approx(0.2 - _margin(0.08))
        assert stats.escape_launch_ms is not None and stats.escape_launch_ms > 0


def test_controls_run_only_when_the_bare_baseline_is_exceeded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controls wait as long as a trial (milliseconds for long kernels): only when needed."""
    runs: list[int] = []  # the waited control trials' delays (the bare baseline's are 0)
    real = timing._tail_baseline

    def counted(device: torch.device, cycles: int, n: int) -> float:
        runs.extend([cycles] * n if cycles else [])
        return real(device, cycles, n)

    monkeypatch.setattr(timing, "_tail_baseline", counted)
    quiet = _Clock(kernel_ms=0.08, noise=0.0)
    _time(monkeypatch, quiet, trials=40)
    assert runs == []
    slow = _Clock(kernel_ms=0.08, noise=0.0)
    slow.wake_ms = 0.06
    _time(monkeypatch, slow, trials=40)
    assert len(runs) == timing.CONTROLS and runs[0] > 0  # each waits (lead remainder + GPU time)
