"""GPU timing by one method for reference and candidate alike (FIELD_NOTES: timing practice).

Per trial: flush L2 by writing a buffer larger than L2, synchronize, record a start event,
call, synchronize the whole device (work queued on other streams is included), record the end
event. Warm-up calls first; trials run in segments over fresh buffer placements and the first
trial of each segment is discarded; median, min, mean, IQR and CV are reported. Inputs rotate
over several sets so one set cannot sit in cache, and the output of the last call on each set
is handed back so the caller can verify what was timed.
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
_empty_cache = torch.cuda.empty_cache


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


def _relocated(inputs: Sequence[Any]) -> list[Any]:
    """The same values in new allocations (tensors cloned; other arguments shared)."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _set_bytes(input_sets: Sequence[Sequence[Any]]) -> int:
    return sum(x.numel() * x.element_size() for s in input_sets for x in s if isinstance(x, torch.Tensor))


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
    segments: int = 1,
    relocate_max_bytes: int = 2 << 30,
) -> TimingStats:
    """Median-based timing of `fn(*inputs)` in milliseconds over `trials` calls, of which the
    first of each segment is discarded.

    Warm-up runs at least `warmup` calls and at least `min_warmup_ms` of wall time: each
    evaluation is a fresh process on a GPU that may have idled, and a few calls of a 100 us
    kernel are not enough to bring its clocks up (measured: 8-10 % run-to-run CV without this).

    `segments` > 1 splits the trials into segments; before each later segment the inputs are
    copied to new allocations (when all sets together are at most `relocate_max_bytes`) and the
    allocator's cache is emptied, so the call's outputs land in new memory too. A memory-bound
    kernel of ~100 us runs up to 30 % slower in some processes than in others depending on where
    its buffers sit (measured on H200, docs/BENCHMARKS.md); pooling trials over several placements
    keeps one unlucky placement from deciding the median.
    If `last_outputs` is given, it receives {set index: output of the last timed call on that set}.
    """
    if flush is None:
        flush = l2_flush_buffer(device)
    segments = max(1, min(segments, trials // 2))
    relocate = segments > 1 and _set_bytes(input_sets) <= relocate_max_bytes
    per_segment = [trials // segments + (1 if i < trials % segments else 0) for i in range(segments)]
    times: list[float] = []
    walls: list[float] = []
    current: Sequence[Sequence[Any]] = input_sets
    with _no_grad():
        for seg, n in enumerate(per_segment):
            if seg > 0:
                if relocate:
                    current = [_relocated(s) for s in current]  # allocated before the old copies go
                _empty_cache()
            t0 = _perf_counter()
            calls = 0
            budget_ms = min_warmup_ms if seg == 0 else 0.0
            while calls < max(warmup, 1) or ((_perf_counter() - t0) * 1e3 < budget_ms and calls < 100_000):
                fn(*current[calls % len(current)])
                calls += 1
                if calls >= warmup:
                    _synchronize(device)
            _synchronize(device)
            seg_times: list[float] = []
            seg_walls: list[float] = []
            for i in range(n):
                k = i % len(current)
                flush.zero_()
                _synchronize(device)
                start = _Event(enable_timing=True)
                end = _Event(enable_timing=True)
                t0 = _perf_counter()
                start.record()
                out = fn(*current[k])
                _synchronize(device)
                end.record()
                end.synchronize()
                seg_walls.append((_perf_counter() - t0) * 1e3)
                seg_times.append(start.elapsed_time(end))
                if last_outputs is not None:
                    last_outputs[k] = out
                del out
            if len(seg_times) > 1:  # the first call of a segment pays for new allocations
                seg_times, seg_walls = seg_times[1:], seg_walls[1:]
            times += seg_times
            walls += seg_walls
    return summarize(times, walls)
