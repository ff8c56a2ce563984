"""GPU timing by one method for reference and candidate alike (FIELD_NOTES: timing practice).

Per trial: flush L2 by writing a buffer larger than L2, synchronize, record a start event,
call, synchronize the whole device (work queued on other streams is included), record the end
event. Warm-up calls first; the first timed trial is discarded; median, min, mean, IQR and CV
are reported. Inputs rotate over several sets so one set cannot sit in cache, and the output
of the last call on each set is handed back so the caller can verify what was timed.
The torch entry points are bound at import (before any candidate exists in the process).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eval_server.schema import TimingStats

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter
_no_grad = torch.no_grad


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


def time_gpu(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    trials: int,
    warmup: int,
    device: torch.device,
    flush: torch.Tensor | None = None,
    last_outputs: dict[int, Any] | None = None,
    min_warmup_ms: float = 200.0,
) -> TimingStats:
    """Median-based timing of `fn(*inputs)` in milliseconds; `trials` includes the discarded first.

    Warm-up runs at least `warmup` calls and at least `min_warmup_ms` of wall time: each
    evaluation is a fresh process on a GPU that may have idled, and a few calls of a 100 us
    kernel are not enough to bring its clocks up (measured: 8-10 % run-to-run CV without this).
    If `last_outputs` is given, it receives {set index: output of the last timed call on that set}.
    """
    if flush is None:
        flush = l2_flush_buffer(device)
    with _no_grad():
        t0 = _perf_counter()
        calls = 0
        while calls < warmup or ((_perf_counter() - t0) * 1e3 < min_warmup_ms and calls < 100_000):
            fn(*input_sets[calls % len(input_sets)])
            calls += 1
            if calls >= warmup:
                _synchronize(device)
        _synchronize(device)
        times: list[float] = []
        walls: list[float] = []
        for i in range(trials):
            k = i % len(input_sets)
            flush.zero_()
            _synchronize(device)
            start = _Event(enable_timing=True)
            end = _Event(enable_timing=True)
            t0 = _perf_counter()
            start.record()
            out = fn(*input_sets[k])
            _synchronize(device)
            end.record()
            end.synchronize()
            walls.append((_perf_counter() - t0) * 1e3)
            times.append(start.elapsed_time(end))
            if last_outputs is not None:
                last_outputs[k] = out
            del out
    if len(times) > 1:
        times, walls = times[1:], walls[1:]
    return summarize(times, walls)
