"""GPU timing by one method for reference and candidate alike (FIELD_NOTES: timing practice).

Per trial: flush L2 by writing a buffer larger than L2, synchronize, queue a short GPU delay,
record a start event, call, record a stream-end event, synchronize the whole device (work
queued on other streams included), record the end event. The reported time is start to
stream-end. Two things make it the GPU's own time rather than host noise:

- the delay ("lead") keeps the GPU busy while the host runs the call's Python and launches, so
  the start event fires when the launches are already queued. A fresh process's host overhead
  varies by tens of microseconds from one process to the next (H200: the same 72 us kernel
  measured 106-159 us per process without the lead, with 0.2 % CV on the GPU's own time;
  bench/timing_spread_probe.py), which is noise RL would reinforce;
- stream-end is recorded before the device synchronize, whose return latency (10-20 us, host
  dependent) would otherwise be in every trial.

Work on another stream is not behind either event, so two checks bound it (`escaped_ms`):
stream-end to end must stay within this process's bare synchronize latency (work still running
after the stream's), and every LAUNCH_EVERY-th trial is timed without the lead, start event
before the call, as the common method does: its median must not exceed the lead-timed one
(with its synchronize tail) by more than the host's own call time (work that ran during the
lead). Each allows a margin. When
either fires, the caller compares `launch_median_ms` instead (evaluate.py), and the CUPTI check
of the first correctness call rejects kernels on other streams outright.

Warm-up calls first; the first timed trial of each kind is discarded; median, min, mean, IQR and
CV are reported. Inputs rotate over several sets so one set cannot sit in cache, and the output
of the last call on each set is handed back so the caller can verify what was timed.
The torch entry points are bound at import (before any candidate exists in the process).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eval_server import persisting_l2
from eval_server.schema import TimingStats

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter
_no_grad = torch.no_grad
_gpu_sleep = getattr(torch.cuda, "_sleep", None)  # spins one GPU thread for N clock cycles
_reset_persisting_l2 = persisting_l2.reset

TIMING_METHOD = "events+device-sync+lead-v1" if _gpu_sleep is not None else "events+device-sync"
LAUNCH_EVERY = 4  # one trial in four is timed without the lead (the escaped-work check)
MIN_LEAD_MS = 0.1
MAX_LEAD_MS = 20.0
# Allowed excess in the two escape checks (host jitter: a legitimate 8 us kernel showed up to
# 14 us beyond its baseline in check trials on an H200): this much plus this share of the
# lead-timed median. The CUPTI stream check rejects side-stream kernels outright; this bounds
# what a candidate that behaves differently while timed could hide.
ESCAPE_MARGIN_MS = 0.025
ESCAPE_MARGIN_FRACTION = 0.10
_cycles_per_ms: dict[int, float] = {}


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


def _cycles_per_ms_on(device: torch.device) -> float:
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


def _noop() -> None:
    return None


@dataclasses.dataclass
class _Trial:
    stream_ms: float  # start to stream-end
    total_ms: float  # start to end (recorded after the device synchronize)
    call_ms: float  # host time of the call
    wall_ms: float  # host time from the call to after the synchronize
    out: Any


def _trial(fn: Callable[..., Any], args: Sequence[Any], device: torch.device, lead_cycles: int) -> _Trial:
    """One timed call; with `lead_cycles` > 0 the GPU delay is queued before the start event."""
    if lead_cycles:
        _gpu_sleep(lead_cycles)
    start, stream_end, end = (_Event(enable_timing=True) for _ in range(3))
    start.record()
    t0 = _perf_counter()
    out = fn(*args)
    t1 = _perf_counter()
    stream_end.record()
    _synchronize(device)
    end.record()
    end.synchronize()
    wall = (_perf_counter() - t0) * 1e3
    return _Trial(start.elapsed_time(stream_end), start.elapsed_time(end), (t1 - t0) * 1e3, wall, out)


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
    """Median-based timing of `fn(*inputs)` in milliseconds over `trials` lead-timed trials (the
    first discarded), with one launch-inclusive check trial per LAUNCH_EVERY - 1 of them
    interleaved (`launch_median_ms`, `escaped_ms`, and the wall clock of those trials).

    Warm-up runs at least `warmup` calls and at least `min_warmup_ms` of wall time: each
    evaluation is a fresh process on a GPU that may have idled, and a few calls of a 100 us
    kernel are not enough to bring its clocks up (measured: 8-10 % run-to-run CV without this).
    The lead is twice the host's call time seen in warm-up plus 50 us, within
    [MIN_LEAD_MS, MAX_LEAD_MS]. If `last_outputs` is given, it receives {set index: output of
    the last timed call on that set}.
    """
    if flush is None:
        flush = l2_flush_buffer(device)
    with _no_grad():
        t0 = _perf_counter()
        calls = 0
        host: list[float] = []
        while calls < warmup or ((_perf_counter() - t0) * 1e3 < min_warmup_ms and calls < 100_000):
            t1 = _perf_counter()
            fn(*input_sets[calls % len(input_sets)])
            host.append((_perf_counter() - t1) * 1e3)
            calls += 1
            if calls >= warmup:
                _synchronize(device)
        _synchronize(device)
        lead = _gpu_sleep is not None
        lead_ms = 0.0
        if lead:
            lead_ms = min(max(2 * statistics.median(host[-8:]) + 0.05, MIN_LEAD_MS), MAX_LEAD_MS)
            lead_cycles = int(lead_ms * _cycles_per_ms_on(device))
        # stream-end to end with nothing queued: this process's bare synchronize latency
        bare_tail = statistics.median(
            t.total_ms - t.stream_ms for t in (_trial(_noop, (), device, 0) for _ in range(21))
        )
        times: list[float] = []  # start to stream-end, lead-timed (every trial without a delay kernel)
        tails: list[float] = []  # stream-end to end (after the device synchronize), same trials
        launch: list[float] = []  # start (before the call) to end: launch-inclusive check trials
        beyond_call: list[float] = []  # per check trial: launch-inclusive time minus the host's call
        walls: list[float] = []
        n = trials * LAUNCH_EVERY // (LAUNCH_EVERY - 1) if lead else trials
        schedule = [lead and j % LAUNCH_EVERY == LAUNCH_EVERY - 1 for j in range(n)]
        if lead and schedule.count(True) < 2:
            schedule += [True] * (2 - schedule.count(True))
        for i, check in enumerate(schedule):
            k = i % len(input_sets)
            _reset_persisting_l2()  # a flush cannot evict persisting lines (persisting_l2.py)
            flush.zero_()
            _synchronize(device)
            t = _trial(fn, input_sets[k], device, 0 if check or not lead else lead_cycles)
            if check:
                launch.append(t.total_ms)
                beyond_call.append(t.total_ms - t.call_ms)
            else:
                times.append(t.stream_ms)
                tails.append(t.total_ms - t.stream_ms)
            if check or not lead:
                walls.append(t.wall_ms)
            if last_outputs is not None:
                last_outputs[k] = t.out
            del t
        if lead:
            # What a single-kernel call on the current stream shows beyond its host call time
            # in a check trial (submission latency, event records): the legitimate baseline.
            _synchronize(device)
            probe = [_trial(_gpu_sleep, (1,), device, 0) for _ in range(15)]
            bare_beyond = statistics.median(t.total_ms - t.call_ms - t.stream_ms for t in probe)
    if len(times) > 1:
        times, tails = times[1:], tails[1:]
    if len(walls) > 1:
        walls = walls[1:]
        launch, beyond_call = (launch[1:], beyond_call[1:]) if lead else (launch, beyond_call)
    stats = summarize(times, walls)
    margin = ESCAPE_MARGIN_MS + ESCAPE_MARGIN_FRACTION * stats.median_ms
    escaped = statistics.median(tails) - bare_tail - margin
    if lead:
        launch_median = statistics.median(launch)
        escaped = max(escaped, statistics.median(beyond_call) - stats.median_ms - bare_beyond - margin)
    else:  # launch-inclusive already: start event before the call, and end after the sync
        launch_median = statistics.median(t + tail for t, tail in zip(times, tails, strict=True))
    return dataclasses.replace(
        stats,
        launch_median_ms=launch_median,
        lead_ms=lead_ms if lead else None,
        escaped_ms=max(0.0, escaped),
    )
