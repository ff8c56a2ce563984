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
after the stream's) or, when it does not, within that of CONTROLS control trials run right
after the timed ones: nothing of the candidate's runs in a control and the host waits in the
device synchronize for a GPU delay as long as its wait in a timed trial (the lead's remainder
after the call, plus the call's GPU time from the warm-up). A synchronize that waited returns
later than a bare one (nothing queued): a legitimate ~2 us Triton kernel, 32 calls per trial,
had tails ~22 us longer per trial typically and ~55-60 us in whole evaluations now and then,
rejected in all three timings in 4-10 % of its evaluations on an H100; against controls that
wait 50 us, as often; against controls that wait as long as a trial, none of 160
(bench/escape_after_failure.py, docs/BENCHMARKS.md). Run only when the bare baseline is
exceeded, the controls cost nothing in the common case (controls after every check trial cost
~0.11 s per KernelBench evaluation, whose trials last milliseconds).
And every LAUNCH_EVERY-th trial is timed without the lead, start event
before the call, as the common method does: its median must not exceed the lead-timed one
(with its synchronize tail) by more than the host's own call time (work that ran during the
lead) and a single kernel's check trial's own excess, measured with a 1-cycle kernel or, when
that is exceeded, with CONTROLS kernels as long as a trial (the same waited synchronize).
Each allows a margin. The checks never change what is compared: the caller re-times
(up to Hardening.escape_retimes) and rejects when every timing escapes (timing_phase.py), and the
CUPTI check of the first correctness call rejects kernels on other streams outright.

One method per problem (`calls_per_trial_for`): a reference whose lead-timed median is below
SHORT_REFERENCE_MS is timed, with its candidate, by trials of k back-to-back calls (k a power of
two, chosen from that recorded median so a trial spans at least BATCH_TRIAL_MS); every other
problem one call per trial. Reported times are per call. CUDA events resolve about 0.5 us (CUDA
runtime documentation), so a 2-8 us kernel is 4-16 ticks, and its per-trial fixed costs (first
launch after the lead, event records) are a large share of it; k calls amortise both, and the
escape margins scale with the trial.

Warm-up first (`_warm_up`): the `warmup` calls, then windows of back-to-back calls timed on the
GPU until the per-call time has settled (clocks up, caches warm) and `min_warmup_ms` have passed,
or until `max_warmup_ms`; the first timed trial of each kind is discarded; median, min, mean, IQR
and CV are reported. The number of trials is fixed (`trials`) or adaptive: with `min_trials` and
`ci_rel`, trials stop once at least `min_trials` lead-timed ones are in and the distribution-free
95 % confidence interval of their median (order statistics) is within +-`ci_rel` of it, or at
`trials` (the maximum) if it never gets that tight. Inputs rotate over several sets so one set cannot sit in cache, and the output
of the last call on each set is handed back so the caller can verify what was timed.
The torch entry points are bound at import (before any candidate exists in the process).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eval_server.checks import persisting_l2
from eval_server.pipeline.timed_calls import FreshInputs, Verification, copy_output, secret_rng
from eval_server.schema import TimingStats

_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter
_no_grad = torch.no_grad
_gpu_sleep = getattr(torch.cuda, "_sleep", None)  # spins one GPU thread for N clock cycles
_reset_persisting_l2 = persisting_l2.reset

# Version of the implementation (part of the reference-cache key: a change makes old entries misses).
TIMING_METHOD = (
    "events+device-sync+lead+fresh-v4" if _gpu_sleep is not None else "events+device-sync+fresh-v4"
)
METHOD_SINGLE = "gpu-time"  # one call per trial
METHOD_BATCHED = "gpu-time-batched"  # `calls_per_trial` back-to-back calls per trial, reported per call
SHORT_REFERENCE_MS = 0.05  # references faster than this per call are timed batched
BATCH_TRIAL_MS = 0.1  # a batched trial spans at least this much reference GPU time
MAX_CALLS_PER_TRIAL = 256  # keeps the lead (2x the host time of a trial) under MAX_LEAD_MS
LAUNCH_EVERY = 4  # one trial in four is timed without the lead (the escaped-work check)
CONTROLS = 8  # control trials of the tail check, when it needs them (module docstring)
MIN_LEAD_MS = 0.1
MAX_LEAD_MS = 20.0
# Allowed excess in the two escape checks (host jitter: a legitimate 8 us kernel showed up to
# 14 us beyond its baseline in check trials on an H200; on an H100, ~2 us kernels timed in batches
# showed 0.03-0.45 us per call beyond 25 us + 10 % in every timing, 2026-11-24): this much plus
# this share of the lead-timed median. The CUPTI stream check rejects side-stream kernels
# outright; this bounds what a candidate that behaves differently while timed could hide.
ESCAPE_MARGIN_MS = 0.025
ESCAPE_MARGIN_FRACTION = 0.35
# Warm-up (_warm_up): windows of about WARMUP_WINDOW_MS of GPU time (at most
# WARMUP_WINDOW_CALLS calls) until the last WARMUP_SETTLED_WINDOWS agree within WARMUP_SETTLE_REL,
# between MIN_WARMUP_MS and MAX_WARMUP_MS of wall time. The maximum is the fixed warm-up used
# before (an idle GPU's clocks take that long to come up: 8-10 % run-to-run CV without it).
# Windows of a few-microsecond kernel hold hundreds of calls, so host jitter averages out; a
# full launch queue only makes the window's time the GPU's own (the lead ignores those calls).
MIN_WARMUP_MS = 20.0
MAX_WARMUP_MS = 200.0
WARMUP_WINDOW_MS = 5.0
WARMUP_WINDOW_CALLS = 1024
WARMUP_SETTLED_WINDOWS = 3
WARMUP_SETTLE_REL = 0.01
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


def calls_per_trial_for(reference_ms: float) -> int:
    """Calls per timed trial for a problem whose reference takes `reference_ms` per call (its
    lead-timed median, one call per trial): 1 from SHORT_REFERENCE_MS up, else the smallest
    power of two k >= 2 with k * reference_ms >= BATCH_TRIAL_MS (at most MAX_CALLS_PER_TRIAL).
    A pure function of the recorded duration, so a problem never changes method between
    evaluations; a power of two so a cached duration that moves a little keeps its k."""
    if reference_ms >= SHORT_REFERENCE_MS:
        return 1
    k = 2
    while not k * reference_ms >= BATCH_TRIAL_MS and k < MAX_CALLS_PER_TRIAL:  # `not`: NaN ends at the cap
        k *= 2
    return k


def method_name(calls_per_trial: int) -> str:
    """The `method` a TimingStats carries for this many calls per trial."""
    return METHOD_SINGLE if calls_per_trial == 1 else METHOD_BATCHED


def _calls(
    fn: Callable[..., Any], calls: Sequence[Sequence[Any]], keep: int | None = None
) -> Callable[[], Any]:
    """One trial's work: `fn` on each argument list back to back; returns a copy of the output of
    call `keep` (taken as soon as it returns), or None."""

    def run() -> Any:
        kept = None
        for j, args in enumerate(calls):
            out = fn(*args)
            if j == keep:
                kept = copy_output(out)
        return kept

    return run


def _per_call(stats: TimingStats, k: int) -> TimingStats:
    """Per-trial times of k-call trials as per-call times (the CV is unchanged)."""
    if k == 1:
        return stats

    def div(x: float | None) -> float | None:
        return None if x is None else x / k

    return dataclasses.replace(
        stats,
        median_ms=stats.median_ms / k,
        min_ms=stats.min_ms / k,
        mean_ms=stats.mean_ms / k,
        iqr_ms=stats.iqr_ms / k,
        wall_median_ms=div(stats.wall_median_ms),
        launch_median_ms=div(stats.launch_median_ms),
        escaped_ms=div(stats.escaped_ms),
        escape_tail_ms=div(stats.escape_tail_ms),
        escape_launch_ms=div(stats.escape_launch_ms),
    )


def _noop() -> None:
    return None


def _tail_baseline(device: torch.device, cycles: int, n: int) -> float:
    """The tail check's baseline (module docstring): the median stream-end to end of `n` trials
    that run nothing of the candidate's, the host waiting in the device synchronize for `cycles`
    of GPU delay (0: a bare synchronize) before it records the end event."""
    return statistics.median(
        t.total_ms - t.stream_ms for t in (_trial(_noop, (), device, cycles) for _ in range(n))
    )


def _launch_baseline(device: torch.device, cycles: int, n: int) -> float:
    """The launch check's baseline: what a check trial of a single `cycles`-long delay kernel on
    the current stream shows beyond its host call time (submission latency, event records, the
    synchronize's return), median of `n`."""
    _synchronize(device)
    probe = [_trial(_gpu_sleep, (cycles,), device, 0) for _ in range(n)]
    return statistics.median(t.total_ms - t.call_ms - t.stream_ms for t in probe)


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


def settled(
    per_call_ms: Sequence[float], windows: int = WARMUP_SETTLED_WINDOWS, rel: float = WARMUP_SETTLE_REL
) -> bool:
    """Whether the last `windows` warm-up windows' per-call GPU times agree within `rel`."""
    last = per_call_ms[-windows:]
    return len(last) == windows and min(last) > 0 and max(last) <= min(last) * (1 + rel)


@dataclasses.dataclass
class _WarmUp:
    host_ms: list[float]  # host time of each call launched onto an idle GPU queue, for the lead
    wall_ms: float
    calls: int
    gpu_ms: float  # GPU time per call in the last window (0.0 if none ran)


def _warm_up(
    fn: Callable[[], Any],
    device: torch.device,
    warmup: int,
    min_ms: float,
    max_ms: float,
) -> _WarmUp:
    """`warmup` synchronized calls of `fn` (one trial's calls; first-call effects), then windows of back-to-back calls, each
    timed by events, until the per-call GPU time has settled (`settled`) and `min_ms` have passed,
    or `max_ms` have. A GPU that just ran the evaluation's earlier phases is warm after a few
    windows; one that idled keeps warming until its clocks are up (as the fixed 200 ms did).
    The host time of each call launched onto an idle queue (after a synchronize: the warm-up
    calls and each window's first) is kept, as the lead's measure of one call's host time; a
    call queued behind others could block on a full launch queue."""
    t0 = _perf_counter()
    calls = 0
    host: list[float] = []

    def call(idle_queue: bool) -> None:
        nonlocal calls
        t1 = _perf_counter()
        fn()
        if idle_queue:
            host.append((_perf_counter() - t1) * 1e3)
        calls += 1

    while calls < max(warmup, 1):  # at least one: the lead needs a host time
        call(idle_queue=True)
        _synchronize(device)
    per_call: list[float] = []
    n = 1
    while True:
        wall = (_perf_counter() - t0) * 1e3
        if wall >= max_ms or calls >= 100_000 or (wall >= min_ms and settled(per_call)):
            break
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        for j in range(n):
            call(idle_queue=j == 0)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / n)
        n = max(1, min(WARMUP_WINDOW_CALLS, math.ceil(WARMUP_WINDOW_MS / max(per_call[-1], 1e-6))))
    _synchronize(device)
    return _WarmUp(
        host_ms=host,
        wall_ms=(_perf_counter() - t0) * 1e3,
        calls=calls,
        gpu_ms=per_call[-1] if per_call else 0.0,
    )


def _enough(times: list[float], trials: int, min_trials: int | None, ci_rel: float) -> bool:
    """Whether the lead-timed trials so far (the first is discarded later) complete the timing."""
    if len(times) >= trials:
        return True
    kept = times[1:]
    return min_trials is not None and len(kept) >= min_trials and median_ci_rel(kept) <= ci_rel


def time_gpu(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    trials: int,
    warmup: int,
    device: torch.device,
    flush: torch.Tensor | None = None,
    verification: Verification | None = None,
    min_warmup_ms: float = MIN_WARMUP_MS,
    max_warmup_ms: float = MAX_WARMUP_MS,
    min_trials: int | None = None,
    ci_rel: float = 0.0,
    calls_per_trial: int = 1,
) -> TimingStats:
    """Median-based timing of `fn(*inputs)` in milliseconds over `trials` lead-timed trials (the
    first discarded), with one launch-inclusive check trial per LAUNCH_EVERY - 1 of them
    interleaved (`launch_median_ms`, `escaped_ms`, and the wall clock of those trials).

    Every call gets fresh input tensors holding the values of `input_sets` in a secret random
    order (timed_calls.FreshInputs). One call per trial: written before the L2 flush (read from
    memory, as before). Batched trials: written after it, so a trial's calls may find their
    inputs in L2 as the same inputs called k times did before (the physics floor allows for it);
    read from memory on every call, a ~3 us ReLU's speedup CV over evaluations went from ~1 % to
    2.03 % on an H100 (docs/BENCHMARKS.md). With `verification`, a
    secret share of trials keep a copy of one call's output in `verification.kept` as (input set
    index, copy) for the caller to compare; their times are not used, and trials are added at the
    end until `verification.min_kept` calls were verified.

    Adaptive (`min_trials` set and `ci_rel` > 0): `trials` becomes the maximum, and timing stops
    as soon as at least `min_trials` kept trials give a median confidence interval within
    +-`ci_rel` (median_ci_rel); `TimingStats.trials` says how many were kept.

    Warm-up runs at least `warmup` calls, then until the per-call GPU time has settled and
    `min_warmup_ms` have passed, or for `max_warmup_ms` (`_warm_up`): each evaluation is a fresh
    process on a GPU that may have idled, and a few calls of a 100 us kernel are not enough to
    bring its clocks up (measured: 8-10 % run-to-run CV without a warm-up of 200 ms); a GPU busy
    with the evaluation's earlier phases settles at once. `min_warmup_ms == max_warmup_ms` is a
    fixed warm-up. The result's `warmup_ms` says how long it took. The lead is twice the host's
    call time seen in warm-up plus 50 us, within [MIN_LEAD_MS, MAX_LEAD_MS]. With
    `calls_per_trial` k > 1 every trial (warm-up, lead, check trials alike) is k back-to-back
    calls and the times returned are per call; the lead and `lead_ms` are per trial. The
    result's `method` and `calls_per_trial` say which was used.
    """
    if calls_per_trial < 1:
        raise ValueError(f"calls_per_trial must be >= 1, got {calls_per_trial}")
    if flush is None:
        flush = l2_flush_buffer(device)
    if min_warmup_ms > max_warmup_ms:
        raise ValueError(f"min_warmup_ms {min_warmup_ms} > max_warmup_ms {max_warmup_ms}")
    fresh = FreshInputs(input_sets, calls_per_trial, verification.rng if verification else secret_rng())
    with _no_grad():
        warm = _warm_up(_calls(fn, fresh.trial()[0]), device, warmup, min_warmup_ms, max_warmup_ms)
        lead = _gpu_sleep is not None
        lead_ms = 0.0
        control_cycles = 0
        if lead:
            host_ms = statistics.median(warm.host_ms[-8:])
            lead_ms = min(max(2 * host_ms + 0.05, MIN_LEAD_MS), MAX_LEAD_MS)
            cycles_per_ms = gpu_cycles_per_ms(device)
            lead_cycles = int(lead_ms * cycles_per_ms)
            # as long as the host waits in a timed trial's synchronize: the lead's remainder
            # after its call, then the call's GPU time
            control_cycles = int(max(lead_ms - host_ms + warm.gpu_ms, 0.0) * cycles_per_ms)
        bare_tail = _tail_baseline(device, 0, 21)  # nothing queued: the bare synchronize latency
        times: list[float] = []  # start to stream-end, lead-timed (every trial without a delay kernel)
        tails: list[float] = []  # stream-end to end (after the device synchronize), same trials
        launch: list[float] = []  # start (before the call) to end: launch-inclusive check trials
        beyond_call: list[float] = []  # per check trial: launch-inclusive time minus the host's call
        walls: list[float] = []
        adaptive = min_trials is not None and ci_rel > 0 and min_trials < trials
        i = 0
        while True:
            check = lead and i % LAUNCH_EVERY == LAUNCH_EVERY - 1
            done = False
            if not check and _enough(times, trials, min_trials if adaptive else None, ci_rel):
                if not lead or len(launch) >= 2:
                    done = True
                else:
                    check = True  # at least two check trials, whatever the count
            if done and not (verification is not None and verification.short()):
                break
            keep = None if verification is None else verification.pick(calls_per_trial, force=done)
            if calls_per_trial == 1:
                calls, call_sets = fresh.trial()
            _reset_persisting_l2()  # a flush cannot evict persisting lines (persisting_l2.py)
            flush.zero_()
            if calls_per_trial > 1:  # written after the flush: batched calls may find inputs in L2
                calls, call_sets = fresh.trial()
            _synchronize(device)
            trial = _calls(fn, calls, keep)
            cycles = 0 if check or not lead else lead_cycles
            if keep is not None:  # a verification trial: the copy ran on the timed stream
                assert verification is not None
                t = verification.run(functools.partial(_trial, trial, (), device, cycles), calls_per_trial)
                verification.kept.append((call_sets[keep], t.out))
                del t, calls, trial
                continue
            t = _trial(trial, (), device, cycles)
            del calls, trial
            if check:
                launch.append(t.total_ms)
                beyond_call.append(t.total_ms - t.call_ms)
            else:
                times.append(t.stream_ms)
                tails.append(t.total_ms - t.stream_ms)
            if check or not lead:
                walls.append(t.wall_ms)
            del t
            i += 1
        if lead:
            bare_beyond = _launch_baseline(device, 1, 15)  # a 1-cycle kernel: no wait
    if len(times) > 1:
        times, tails = times[1:], tails[1:]
    if len(walls) > 1:
        walls = walls[1:]
        launch, beyond_call = (launch[1:], beyond_call[1:]) if lead else (launch, beyond_call)
    stats = summarize(times, walls)
    margin = ESCAPE_MARGIN_MS + ESCAPE_MARGIN_FRACTION * stats.median_ms
    tail_excess = statistics.median(tails) - bare_tail - margin
    if tail_excess > 0:  # beyond a bare synchronize's return: the baseline that waits like a trial
        tail_excess = statistics.median(tails) - _tail_baseline(device, control_cycles, CONTROLS) - margin
    launch_excess = None
    if lead:
        launch_median = statistics.median(launch)
        launch_excess = statistics.median(beyond_call) - stats.median_ms - bare_beyond - margin
        if launch_excess > 0:  # the same for the launch check: a baseline kernel as long as a trial's
            waited = _launch_baseline(device, int(stats.median_ms * cycles_per_ms), CONTROLS)
            launch_excess = statistics.median(beyond_call) - stats.median_ms - waited - margin
    else:  # launch-inclusive already: start event before the call, and end after the sync
        launch_median = statistics.median(t + tail for t, tail in zip(times, tails, strict=True))
    stats = dataclasses.replace(
        stats,
        launch_median_ms=launch_median,
        lead_ms=lead_ms if lead else None,
        escaped_ms=max(0.0, tail_excess, launch_excess or 0.0),
        escape_tail_ms=tail_excess,
        escape_launch_ms=launch_excess,
        method=method_name(calls_per_trial),
        calls_per_trial=calls_per_trial,
        warmup_ms=round(warm.wall_ms, 3),
        warmup_calls=warm.calls,
        verified_calls=len(verification.kept) if verification is not None else None,
    )
    return _per_call(stats, calls_per_trial)
