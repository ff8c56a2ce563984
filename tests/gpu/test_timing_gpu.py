"""eval_server.timing.time_gpu on a real GPU: the lead excludes host launch time, and work that
runs outside the timed stream during the lead is measured by the launch-inclusive check trials.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_timing_gpu.py`.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server import timing  # noqa: E402

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

    stats = timing.time_gpu(slow_host, [[x]], trials=60, warmup=3, device=DEVICE)
    plain = timing.time_gpu(torch.relu, [[x]], trials=60, warmup=3, device=DEVICE)
    assert stats.lead_ms is not None and stats.lead_ms >= 0.3 * 2
    assert stats.escaped_ms == 0.0
    assert stats.launch_median_ms >= 0.3
    assert stats.median_ms < 0.3, stats
    # the same GPU work with and without the host time: within 20 %
    assert abs(stats.median_ms - plain.median_ms) <= 0.2 * plain.median_ms + 0.005, (stats, plain)


def test_work_on_a_side_stream_during_the_lead_is_caught() -> None:
    """GPU work on a private stream, not waited for, while the host spends 0.3 ms in Python: the
    part that overlaps the lead vanishes from the lead-timed trials; the launch-inclusive check
    trials contain it, and the excess is reported as escaped (evaluate.py then compares the
    launch-inclusive medians)."""
    cycles = 4_000_000
    work_ms = _gpu_ms_of_sleep(cycles)  # ~2 ms at H200 clocks
    side = torch.cuda.Stream(device=DEVICE)
    x = torch.randn(1024, device=DEVICE)

    def hidden(t: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
        t_end = time.perf_counter() + 3e-4
        while time.perf_counter() < t_end:
            pass
        return t + 1

    stats = timing.time_gpu(hidden, [[x]], trials=30, warmup=3, device=DEVICE)
    assert stats.launch_median_ms >= 0.9 * work_ms, stats
    assert stats.median_ms < stats.launch_median_ms - 0.4, stats  # the lead hid part of the work
    assert stats.escaped_ms > 0.1, stats
