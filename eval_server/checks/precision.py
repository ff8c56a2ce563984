"""The precision rule, one definition for both processes: a candidate's output may be no further
from a float64 computation than the policy allows (the fp32 reference's own error times a factor,
or that of 10-bit-mantissa inputs under policy "tf32"). The candidate's process applies it to its
first correctness trial; the judge to every call it compares, so that a candidate that computes
in fp32 only while it believes it is checked (its first calls) and in tf32 or bf16 after gains
nothing."""

from __future__ import annotations

import math
from typing import Any

from eval_server.checks.compare import normalized_error


def check_needed(max_abs_diff: float | None, ref_scale: float, floor: float) -> bool:
    """Whether the candidate's float64 error pass can change the verdict.

    The check rejects only an error above max(floor, ...), and the error it measures is at most
    err32 = max|out - ref| / max|ref|. The comparison already has max|out - ref| (in fp32 math:
    at most 2**-23 relative below the exact value; the margin covers it) and the reference phase
    a lower bound of max|ref|: when that bound on err32 is under the floor, the check cannot fire
    and its pass over the output (a float64 copy of every element) is skipped.
    """
    if max_abs_diff is None or not math.isfinite(max_abs_diff):
        return True
    if max_abs_diff == 0.0:
        return False
    return ref_scale <= 0.0 or max_abs_diff * (1.0 + 2.0**-20) / ref_scale > floor


def excess(out: Any, expected: Any, max_abs_diff: float | None, prec: Any, hard: Any) -> tuple[float, float] | None:
    """(error, limit) when `out` is further from float64 than `hard`'s policy allows for a problem
    with precision facts `prec` (pipeline.context.Precision), else None. `expected`: the fp32
    reference's output on the same inputs; `max_abs_diff`: their comparison's."""
    floor = hard.precision_floor.get(prec.dtype, hard.precision_floor["float32"])
    if not check_needed(max_abs_diff, prec.ref_scale, floor):
        return None
    err32 = normalized_error(out, expected)
    if err32 is None:
        return None
    # Distance to float64 is at least the distance to the reference minus the reference's own
    # error (triangle inequality), so this never overstates the candidate's error.
    err = max(0.0, err32 - prec.ref_error)
    factor = hard.precision_factor if hard.precision_policy == "fp32" else hard.precision_factor_tf32
    limit = max(floor, factor * prec.budget)
    return (err, limit) if err > limit else None


def message(err: float, limit: float, dtype: str, policy: str) -> str:
    what = "an fp32 computation" if policy == "fp32" else "tf32/fp16-precision inputs with fp32 accumulation"
    return (
        f"Your output is {err:.2e} away from a float64 computation (max abs diff / max abs value), "
        f"over the limit {limit:.2e} allowed for {what} ({dtype} problem). Keep the precision "
        "of the reference: fp32 loads and accumulation; for fp32 tl.dot use input_precision='ieee' "
        "or 'tf32x3' (plain tf32, fp16, bf16 or fp8 operands lose precision)."
    )
