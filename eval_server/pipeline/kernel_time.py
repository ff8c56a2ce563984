"""Where one forward's GPU time went: the candidate's own kernels against everything else the
device ran (the profiling-based reward of Dr. Kernel).

The runtime checks already reject any compute kernel that is not the candidate's (ATen, cuBLAS,
...), so what else can take time in an `ok` forward is data movement the evaluator allows:
copies (`.contiguous()`, `.clone()`), fills (`torch.zeros`), memsets. A kernel that is correct
but spends most of its time copying its input around is lazy in the same sense as one that leaves
the bottleneck to torch: the share of time in its own kernels says so, the reward can scale the
speedup bonus by it, and the feedback shows the model where the time went.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable

from eval_server.schema import KernelTime

__all__ = ["TOP_OTHERS", "kernel_time", "reference_kernels", "top_activities", "with_reference"]

TOP_OTHERS = 3  # other activities named in the result and the feedback


def top_activities(times: Iterable[tuple[str, float]], n: int) -> tuple[float, list[dict[str, float | str]]]:
    """All device time of `times` ((activity name, microseconds)) and its `n` largest activities,
    summed by name, as [{"name", "us"}] largest first (negative durations are clock artefacts)."""
    by_name: dict[str, float] = defaultdict(float)
    for name, us in times:
        if us >= 0:
            by_name[name] += us
    largest = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return sum(by_name.values()), [{"name": name[:120], "us": round(us, 3)} for name, us in largest]


def reference_kernels(times: Iterable[tuple[str, float]]) -> dict[str, object] | None:
    """What a profiled reference forward leaves for the comparison (cached with the reference's
    facts): {"total_us", "top"}; None when the device recorded no time."""
    total, top = top_activities(times, TOP_OTHERS)
    return None if total <= 0 else {"total_us": round(total, 3), "top": top}


def with_reference(kt: KernelTime | None, reference: dict[str, object] | None) -> KernelTime | None:
    """The candidate's split with the reference's forward beside it (reference_kernels)."""
    if kt is None or not reference:
        return kt
    top = reference.get("top")
    return dataclasses.replace(
        kt,
        reference_us=float(reference["total_us"]),  # type: ignore[arg-type]
        reference_top=[dict(t) for t in top] if isinstance(top, list) else [],
    )


def kernel_time(times: Iterable[tuple[str, float]], is_own: Callable[[str], bool]) -> KernelTime | None:
    """The split of `times` ((activity name, microseconds) of one profiled forward) into the
    candidate's kernels (`is_own`) and the rest, the rest's largest activities named (summed by
    name); None when the device recorded no time at all."""
    own, others = 0.0, []
    for name, us in times:
        if not is_own(name):
            others.append((name, us))
        elif us >= 0:  # a negative duration is a clock artefact, not time spent
            own += us
    rest, largest = top_activities(others, TOP_OTHERS)
    total = own + rest
    if total <= 0:
        return None
    return KernelTime(
        own_share=round(own / total, 4), own_us=round(own, 3), total_us=round(total, 3), others=largest
    )
