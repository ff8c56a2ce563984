"""GPU timing by one method for reference and candidate alike (FIELD_NOTES: timing practice).

Per trial: flush L2 by writing a buffer larger than L2, synchronize, record a start event,
call, synchronize the whole device (work queued on other streams is included), record the end
event. Warm-up calls first; the first timed trial is discarded; median, min, mean, IQR and CV
are reported. Inputs rotate over several sets so one set cannot sit in cache.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eval_server.schema import TimingStats

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A byte buffer of at least twice the device's L2 (256 MiB if the size is unknown)."""
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    nbytes = max(2 * l2, 256 * 1024 * 1024) if l2 else 256 * 1024 * 1024
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def summarize(times_ms: Sequence[float]) -> TimingStats:
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
    )


def time_gpu(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    trials: int,
    warmup: int,
    device: torch.device,
    flush: torch.Tensor | None = None,
) -> TimingStats:
    """Median-based timing of `fn(*inputs)` in milliseconds; `trials` includes the discarded first."""
    if flush is None:
        flush = l2_flush_buffer(device)
    with torch.no_grad():
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
        _synchronize(device)
        times: list[float] = []
        for i in range(trials):
            args = input_sets[i % len(input_sets)]
            flush.zero_()
            _synchronize(device)
            start = _Event(enable_timing=True)
            end = _Event(enable_timing=True)
            start.record()
            fn(*args)
            _synchronize(device)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return summarize(times[1:] if len(times) > 1 else times)
