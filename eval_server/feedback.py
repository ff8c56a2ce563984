"""The text the model sees after each turn: what happened, the real evidence, what to fix.

TritonForge's feedback omitted compiler errors and numbers; ours always carries the trimmed
traceback or compiler message, the diffs against tolerance, the checks that fired with their
fixes, and the speedup with both timings when measured.
"""

from __future__ import annotations

from types import MappingProxyType

from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_CRASHED,
    STATUS_INCORRECT,
    STATUS_OK,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_SERVER_ERROR,
    STATUS_TIMEOUT,
    STATUS_UNSUPPORTED,
    EvalRequest,
    EvalResult,
    result_for,
)

_HEADLINES = MappingProxyType(
    {
        STATUS_OK: "Your kernel compiled and produced correct results.",
        STATUS_COMPILE_ERROR: "Your code failed to compile or import.",
        STATUS_RUNTIME_ERROR: "Your code raised an error while running.",
        STATUS_INCORRECT: "Your kernel ran but its output does not match the reference.",
        STATUS_REJECTED: "Your submission was rejected by the evaluator's checks.",
        STATUS_TIMEOUT: "Your submission did not finish within the time limit.",
        STATUS_CRASHED: "Your submission crashed the evaluation process.",
        STATUS_REFERENCE_ERROR: "The reference problem itself failed to run; this is not your fault.",
        STATUS_SERVER_ERROR: "The evaluator failed internally; this is not your fault.",
        STATUS_UNSUPPORTED: "This evaluator cannot run your submission; this is not your fault.",
    }
)

# What usually causes a failure of each status. A hint, never an instruction: the episode's
# user message adds the one instruction of the turn (slime_ext/rollout/prompts.py), so the model
# is told what to do once. A compile error's own text says what is wrong.
_HINTS = MappingProxyType(
    {
        STATUS_RUNTIME_ERROR: "Likely causes: shapes, strides, pointer arithmetic, masks or the launch grid.",
        STATUS_INCORRECT: "Likely causes: indexing, masks for the tail elements, reduction order, the grid or dtypes.",
        STATUS_TIMEOUT: "Likely causes: a loop that never ends, a huge launch grid or an expensive fallback.",
        STATUS_CRASHED: "Likely causes: out-of-bounds memory accesses (missing masks), wrong pointer offsets or "
        "process exits.",
    }
)


# Below this share of a forward's GPU time in the candidate's own kernels the feedback says so.
LOW_OWN_SHARE = 0.8


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def build_feedback(result: EvalResult, tolerance: float | None = None) -> str:
    """Render `result` as plain text; pure function of the result so it is easy to test."""
    lines = [f"Status: {result.status}. {_HEADLINES.get(result.status, '')}".rstrip()]
    if result.error and result.error.get("traceback"):
        lines += ["", result.error["traceback"]]
    elif result.error and result.error.get("message"):
        lines += ["", result.error["message"]]
    fired = [c for c in result.checks if c.severity == "reject"]
    if fired:
        lines += ["", "Checks that failed:"] + [f"- [{c.id}] {c.message}" for c in fired]
    if result.status == STATUS_INCORRECT and result.trials:
        failed = [t for t in result.trials if not t.passed]
        lines += ["", f"Correctness: {len(result.trials) - len(failed)}/{len(result.trials)} trials passed."]
        for t in failed[:3]:
            if t.mismatch:
                lines.append(f"- trial seed {t.seed}: {t.mismatch}")
            else:
                tol = f" (tolerance atol=rtol={tolerance:g})" if tolerance is not None else ""
                lines.append(f"- trial seed {t.seed}: max abs diff {_fmt(t.max_abs_diff)}{tol}")
                if t.detail:
                    lines.append(f"  {t.detail}")
    if result.status == STATUS_OK:
        if result.max_abs_diff is not None:
            lines.append(f"Max abs diff over {len(result.trials)} trials: {_fmt(result.max_abs_diff)}.")
        if result.speedup is not None and result.reference_timing and result.candidate_timing:
            lines.append(
                f"Speedup: {result.speedup:.2f}x (reference {result.reference_timing.median_ms:.4g} ms, "
                f"yours {result.candidate_timing.median_ms:.4g} ms, median of {result.candidate_timing.trials})."
            )
            if result.speedup_vs_compile is not None and result.compile_reference_timing:
                lines.append(
                    f"Against torch.compile: {result.speedup_vs_compile:.2f}x (compiled reference "
                    f"{result.compile_reference_timing.median_ms:.4g} ms)."
                )
            elif result.compile_baseline and result.compile_baseline.startswith("failed"):
                lines.append(f"torch.compile baseline {result.compile_baseline}.")
            if result.speedup < 1.0:
                lines.append(
                    "Your kernel is slower than the reference: fuse operations, use larger blocks, "
                    "coalesced loads and fewer launches."
                )
        else:
            lines.append("Speed was not measured on this evaluator.")
        lines += _roofline_lines(result)
        lines += _kernel_time_lines(result)
    if result.status in _HINTS:
        lines += ["", _HINTS[result.status]]
    return "\n".join(lines).strip()


def _roofline_lines(result: EvalResult) -> list[str]:
    """How close the measured time came to the GPU's peaks, when the device is in the table."""
    r = result.roofline
    if r is None:
        return []
    text = f"Throughput: {r.gbs:.4g} GB/s, {r.bandwidth_share:.0%} of the {r.device}'s peak memory bandwidth"
    if r.tflops is not None and r.compute_share is not None:
        text += f"; {r.tflops:.3g} TFLOP/s, {r.compute_share:.0%} of its dense tensor-core peak"
    return [text + " (estimated from the inputs, outputs and FLOPs of one call)."]


def _kernel_time_lines(result: EvalResult) -> list[str]:
    """Where one forward's GPU time went, when it was profiled."""
    kt = result.kernel_time
    if kt is None:
        return []
    head = f"GPU time of one forward: {kt.own_share:.0%} in your kernels ({kt.own_us:.4g} of {kt.total_us:.4g} us)"
    if not kt.others:
        lines = [head + "."]
    else:
        rest = ", ".join(f"{o['name'][:60]} {o['us'] / kt.total_us:.0%}" for o in kt.others)
        lines = [f"{head}; the rest: {rest}."]
    if kt.reference_us:
        ref = f"The reference's forward: {kt.reference_us:.4g} us"
        if kt.reference_top:
            top = kt.reference_top[0]
            ref += f", {top['us'] / kt.reference_us:.0%} of it in {str(top['name'])[:60]} (its bottleneck)"
        lines.append(ref + ".")
    if kt.own_share < LOW_OWN_SHARE:
        lines.append(
            "Most of the time is not in your kernels: avoid copies and fills that the computation does "
            "not need (.contiguous(), .clone(), zero-initialised outputs) and do the work in your kernels."
        )
    return lines


def failure_result(
    request: EvalRequest, status: str, message: str, device: str = "", traceback: str = ""
) -> EvalResult:
    """A result for an evaluation that ended without the pipeline's own verdict (timeout, crash,
    lost worker), with its feedback already rendered. `traceback`: where the evaluator failed
    (server_error), for whoever reads the result (an episode ends at server_error: no policy
    sees it)."""
    result = result_for(request, status, device)
    result.error = {"type": status, "message": message, "traceback": traceback}
    result.feedback = build_feedback(result)
    return result
