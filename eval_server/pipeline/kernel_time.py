"""Where one forward's GPU time went: the candidate's own kernels against everything else the
device ran (issue 29, the profiling-based reward of Dr. Kernel).

The runtime checks already reject any compute kernel that is not the candidate's (ATen, cuBLAS,
...), so what else can take time in an `ok` forward is data movement the evaluator allows:
copies (`.contiguous()`, `.clone()`), fills (`torch.zeros`), memsets. A kernel that is correct
but spends most of its time copying its input around is lazy in the same sense as one that leaves
the bottleneck to torch: the share of time in its own kernels says so, the reward can scale the
speedup bonus by it, and the feedback shows the model where the time went.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from eval_server.schema import KernelTime

__all__ = ["TOP_OTHERS", "kernel_time"]

TOP_OTHERS = 3  # other activities named in the result and the feedback


def kernel_time(times: Iterable[tuple[str, float]], is_own: Callable[[str], bool]) -> KernelTime | None:
    """The split of `times` ((activity name, microseconds) of one profiled forward) into the
    candidate's kernels (`is_own`) and the rest, the rest's largest activities named (summed by
    name); None when the device recorded no time at all."""
    own = 0.0
    others: dict[str, float] = defaultdict(float)
    for name, us in times:
        if us < 0:
            continue  # a clock artefact, not time spent
        if is_own(name):
            own += us
        else:
            others[name] += us
    total = own + sum(others.values())
    if total <= 0:
        return None
    largest = sorted(others.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OTHERS]
    return KernelTime(
        own_share=round(own / total, 4),
        own_us=round(own, 3),
        total_us=round(total, 3),
        others=[{"name": name[:120], "us": round(us, 3)} for name, us in largest],
    )
