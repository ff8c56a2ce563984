"""eval_server.pipeline.timing.time_gpu on a real GPU: the lead excludes host launch time, and work that
runs outside the timed stream during the lead is measured by the launch-inclusive check trials,
one call per trial or k calls (the method of short problems); and the A/A steadiness of a small
kernel's speedup over evaluations through a pool worker, a restart included.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_timing_gpu.py`.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server.launch import first_gpu  # noqa: E402
from eval_server.pipeline import timing  # noqa: E402

DEVICE = torch.device("cuda", 0)


def _gpu_ms_of_sleep(cycles: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(DEVICE)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_host_overhead_is_not_in_the_lead_timed_median() -> None:
    """A call that spends 0.3 ms in Python before a short kernel: the lead-timed median is the
    kernel's GPU time, the launch-inclusive one carries the 0.3 ms, and nothing 'escaped'."""
    x = torch.randn(1 << 20, device=DEVICE)

    def slow_host(t: torch.Tensor) -> torch.Tensor:
        t_end = time.perf_counter() + 3e-4
        while time.perf_counter() < t_end:
            pass
        return torch.relu(t)

    # As evaluate.py does: a timing whose escape checks fire is re-timed (escape_retimes, 2) and
    # only rejected when every timing escapes. Seen once on an H100 (2026-11-25): 2.2 us over
    # the margin in one timing of this 7 us kernel.
    for _ in range(3):
        stats = timing.time_gpu(slow_host, [[x]], trials=60, warmup=3, device=DEVICE)
        if stats.escaped_ms == 0.0:
            break
    plain = timing.time_gpu(torch.relu, [[x]], trials=60, warmup=3, device=DEVICE)
    assert stats.lead_ms is not None and stats.lead_ms >= 0.3 * 2
    assert stats.escaped_ms == 0.0, stats
    assert stats.launch_median_ms >= 0.3
    assert stats.median_ms < 0.3, stats
    # the same GPU work with and without the host time: within 20 %
    assert abs(stats.median_ms - plain.median_ms) <= 0.2 * plain.median_ms + 0.005, (stats, plain)


def _side_stream_call(cycles: int, host_s: float):
    """A forward that queues `cycles` of GPU sleep on a private stream, not waited for, spends
    `host_s` in Python, and returns t + 1 from the current stream."""
    side = torch.cuda.Stream(device=DEVICE)

    def hidden(t: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
        t_end = time.perf_counter() + host_s
        while time.perf_counter() < t_end:
            pass
        return t + 1

    return hidden


def test_work_on_a_side_stream_during_the_lead_is_caught() -> None:
    """GPU work on a private stream, not waited for, while the host spends 0.3 ms in Python: the
    part that overlaps the lead vanishes from the lead-timed trials; the launch-inclusive check
    trials contain it, and the excess is reported as escaped (evaluate.py then re-times once and
    rejects when it repeats)."""
    cycles = 4_000_000
    work_ms = _gpu_ms_of_sleep(cycles)  # ~2 ms at H200 clocks
    x = torch.randn(1024, device=DEVICE)
    stats = timing.time_gpu(_side_stream_call(cycles, 3e-4), [[x]], trials=30, warmup=3, device=DEVICE)
    assert stats.launch_median_ms >= 0.9 * work_ms, stats
    assert stats.median_ms < stats.launch_median_ms - 0.4, stats  # the lead hid part of the work
    assert stats.escaped_ms > 0.1, stats


def test_batched_trials_report_per_call_times_of_a_short_kernel() -> None:
    """k back-to-back calls per trial (the method of problems whose reference is under 50 us):
    per-call times close to one call per trial, the method recorded, a small in-process spread."""
    x = torch.randn(64, 1000, device=DEVICE)
    single = timing.time_gpu(torch.relu, [[x]], trials=100, warmup=3, device=DEVICE)
    k = timing.calls_per_trial_for(single.median_ms)
    assert single.median_ms < timing.SHORT_REFERENCE_MS and k >= 2, single
    batched = timing.time_gpu(torch.relu, [[x]], trials=100, warmup=3, device=DEVICE, calls_per_trial=k)
    assert (single.method, single.calls_per_trial) == (timing.METHOD_SINGLE, 1)
    assert (batched.method, batched.calls_per_trial) == (timing.METHOD_BATCHED, k)
    # warm L2 after the first call of a trial: per call at most the single-call time (+ 20 %)
    assert 0 < batched.median_ms <= 1.2 * single.median_ms, (single, batched)
    # Trial-to-trial spread of a ~2 us kernel: 7.9 % CV on an H200 (2026-11-24); what the reward
    # uses is the median, whose spread over evaluations stayed under 1 % (bench/timing_noise.py).
    assert batched.cv < 0.15 and batched.escaped_ms == 0.0, batched


def test_side_stream_work_is_caught_in_batched_trials_too() -> None:
    x = torch.randn(1024, device=DEVICE)
    hidden = _side_stream_call(1_000_000, 1e-4)  # ~0.5 ms of side work per call, 4 calls per trial
    stats = timing.time_gpu(hidden, [[x]], trials=30, warmup=3, device=DEVICE, calls_per_trial=4)
    assert stats.escaped_ms > 0.05, stats


def test_small_kernel_speedup_is_steady_over_evaluations_and_a_worker_restart(tmp_path) -> None:
    """Issue 16: a ~4 us ReLU evaluated 8 times through a pool worker (cache empty at first, a
    worker restart before round 3, a crashing candidate before round 5) keeps one method and a
    speedup CV within 2 %; a 72 us layer norm is timed one call per trial."""
    from bench import timing_noise

    cases = timing_noise.select_cases("relu_large:64x1000,layernorm_large:full")
    records = timing_noise.run(cases, first_gpu(), repeats=8, pause_s=2.0, restart_at=3, crash_at=5, workdir=tmp_path)
    rows = timing_noise.summarize(records)
    print(timing_noise.format_table(rows))
    assert timing_noise.failures(rows, max_cv=0.02) == [], timing_noise.format_table(rows)
    relu, layernorm = rows
    assert relu.methods[0].startswith(timing.METHOD_BATCHED + " x"), relu
    assert layernorm.methods == [timing.METHOD_SINGLE + " x1"], layernorm
    assert relu.tagged["after-restart"] is not None and relu.tagged["after-crash"] is not None
