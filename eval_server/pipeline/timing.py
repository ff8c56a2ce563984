"""Timing primitives the judge's timing (eval_server/judge/timing.py) builds on, and the
statistics every report reads: the median's confidence interval, an L2 flush buffer, the summary
of a list of times, the GPU's sleep-kernel clock and the method names.

The candidate's process never times anything: its first layer checks, the judge times
(eval_server/judge), with these. The torch entry points are bound at import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from eval_server.schema import TimingStats

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_gpu_sleep = getattr(torch.cuda, "_sleep", None)  # spins one GPU thread for N clock cycles

METHOD_SINGLE = "gpu-time"  # one call per trial
METHOD_BATCHED = "gpu-time-batched"  # `calls_per_trial` back-to-back calls per trial, reported per call
_cycles_per_ms: dict[int, float] = {}
_Z95 = 1.96


def median_ci_rel(times_ms: Sequence[float]) -> float:
    """Half-width of the ~95 % confidence interval of the median, relative to the median.

    Distribution-free: the interval between the order statistics n/2 -+ 1.96 sqrt(n)/2 (the
    normal approximation of the binomial), clipped to the sample. inf for fewer than 2 values.
    """
    n = len(times_ms)
    if n < 2:
        return math.inf
    xs = sorted(times_ms)
    half = _Z95 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    med = statistics.median(xs)
    return (xs[hi] - xs[lo]) / (2 * med) if med > 0 else math.inf


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A byte buffer of at least twice the device's L2 (256 MiB if the size is unknown)."""
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    nbytes = max(2 * l2, 256 * 1024 * 1024) if l2 else 256 * 1024 * 1024
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def summarize(times_ms: Sequence[float], wall_ms: Sequence[float] | None = None) -> TimingStats:
    if not times_ms:
        raise ValueError("summarize() needs at least one timing")
    xs = sorted(times_ms)
    n = len(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if n >= 2 else [xs[0]] * 3
    mean = statistics.fmean(xs)
    std = statistics.pstdev(xs) if n >= 2 else 0.0
    return TimingStats(
        median_ms=statistics.median(xs),
        min_ms=xs[0],
        mean_ms=mean,
        iqr_ms=q[2] - q[0],
        cv=std / mean if mean > 0 else 0.0,
        trials=n,
        wall_median_ms=statistics.median(wall_ms) if wall_ms else None,
    )


def gpu_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of the delay kernel, measured once per process: the
    kernel is loaded first (its first launch loads the module, which would stretch the
    interval), each measured delay is queued behind another so that it runs back to back, and
    the shortest of three is kept (more cycles per ms: a lead that errs on the long side)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _cycles_per_ms:
        assert _gpu_sleep is not None
        _gpu_sleep(1000)
        _synchronize(device)
        best = float("inf")
        for _ in range(3):
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _gpu_sleep(200_000)
            start.record()
            _gpu_sleep(1_000_000)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        _cycles_per_ms[index] = 1_000_000 / max(best, 1e-3)
    return _cycles_per_ms[index]


def method_name(calls_per_trial: int) -> str:
    """The `method` a TimingStats carries for this many calls per trial."""
    return METHOD_SINGLE if calls_per_trial == 1 else METHOD_BATCHED
