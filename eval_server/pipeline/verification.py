"""Whether the candidate's outputs are right, as the first layer sees them: the correctness phase
(trials on the correctness seeds, the first trial's checks, the precision check against float64),
the guard of what candidate code must leave untouched, and the verification of one output against
a reference output computed only then.

Separate from candidate.py (which runs candidate code): every comparison with a reference output
in the candidate's process happens in this module (the judge compares again, in its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eval_server.checks import precision
from eval_server.checks.compare import compare_outputs
from eval_server.checks.runtime import (
    GlobalStateSnapshot,
    NamespaceSnapshot,
    TorchOpRecorder,
    default_guarded_namespaces,
    reference_namespaces,
)
from eval_server.pipeline import loader
from eval_server.pipeline.candidate import own_kernels, run_candidate
from eval_server.pipeline.context import LAUNCHES, EvalContext, Reference, sync
from eval_server.pipeline.kernel_time import with_reference
from eval_server.pipeline.verdicts import Stop, reference_errors, reject
from eval_server.schema import STATUS_INCORRECT, STATUS_REJECTED, Check, EvalOptions, EvalResult, TrialResult


@dataclass
class Guard:
    """What candidate code must leave as it found it: checked before every reference run (the
    reference runs after candidate code, _expected) and before every verdict."""

    namespaces: NamespaceSnapshot
    global_state: GlobalStateSnapshot

    @classmethod
    def snapshot(cls, ref: Reference) -> Guard:
        """Taken after the reference phase and before the candidate's import: torch, triton, the
        evaluator, the reference module and its classes, global module hooks, active torch modes."""
        return cls(
            NamespaceSnapshot(default_guarded_namespaces() + reference_namespaces(ref.module, ref.model)),
            GlobalStateSnapshot(),
        )


def check_not_patched(result: EvalResult, guard: Guard) -> None:
    changed = guard.global_state.changed()
    if changed:
        reject(
            result,
            "runtime.global_state",
            "The candidate changed process-wide torch state that alters every computation: "
            + ", ".join(changed)
            + ". Do not register global module hooks or leave torch function/dispatch modes active.",
        )
    patched = guard.namespaces.changed()
    if patched:
        reject(
            result,
            "runtime.monkey_patch",
            "The candidate replaced functions the evaluator relies on: "
            + ", ".join(patched[:8])
            + ". Do not modify torch, triton, time or the evaluator at import or run time.",
        )


def correctness_phase(
    opts: EvalOptions,
    ctx: EvalContext,
    result: EvalResult,
    ref: Reference,
    model: Any,
    guard: Guard,
) -> int:
    """The correctness trials. Returns the fewest own kernels one call launched (the timing
    phase holds every timed call to it): on a GPU as CUPTI saw them in the profiled trials,
    otherwise by the launch recorder. The first trial is profiled; the last one too when the first
    may have launched more than a call needs (autotuning, one-time work): backend "cuda" (no
    recorder), two trials or fewer, or a recorder count of the first trial unlike the second's.
    The recorder only decides whether to profile: a forged count can add a profiled trial, never
    lower what CUPTI counted."""
    poison_bytes = ref.output_bytes + (64 << 20)
    per_call: list[int] = []
    recorded: list[int] = []  # the launch recorder's count per trial (Triton)
    last = len(ref.seeds) - 1
    profiled = ctx.device.type == "cuda" and (ctx.hardening.profile_kernels or ctx.cuda is not None)
    for i, seed in enumerate(ref.seeds):
        args = loader.make_inputs(ref.module, seed, ctx.device)
        profile = profiled and (
            i == 0 or (i == last and (ctx.cuda is not None or last <= 1 or recorded[0] != recorded[1]))
        )
        out, ops, launches = run_candidate(model, args, ctx, result, poison_bytes, profile)
        if profile:
            result.kernel_time = with_reference(result.kernel_time, ref.kernels)
        recorded.append(LAUNCHES.count)
        if launches is not None and (profile or not profiled):
            per_call.append(launches)
        pristine = loader.make_inputs(ref.module, seed, ctx.device)
        if i == 0:
            result.kernel_launches = launches or 0
            _first_trial_checks(result, ops, args, pristine, ctx)
        else:
            torch_compute_check(result, ops, ctx)
            _stop_if_rejected(result)
        del args
        expected = _expected(result, ctx, ref, guard, seed, pristine)
        cmp = _compare(ctx, expected, out, opts)
        result.trials.append(
            TrialResult(seed, cmp.passed, cmp.max_abs_diff, cmp.max_rel_diff, cmp.mismatch, cmp.detail)
        )
        if i == 0 and cmp.passed:
            precision_check(result, ctx, ref, out, expected, cmp.max_abs_diff)
        del out, expected, pristine
    check_not_patched(result, guard)
    diffs = [t.max_abs_diff for t in result.trials if t.max_abs_diff is not None]
    rels = [t.max_rel_diff for t in result.trials if t.max_rel_diff is not None]
    result.max_abs_diff = max(diffs) if diffs else None
    result.max_rel_diff = max(rels) if rels else None
    if not all(t.passed for t in result.trials):
        result.status = STATUS_INCORRECT
        raise Stop
    result.correct = True
    return min(per_call, default=0)


def _first_trial_checks(
    result: EvalResult, ops: TorchOpRecorder, args: list[Any], pristine: list[Any], ctx: EvalContext
) -> None:
    if result.kernel_launches == 0:
        how = "call a function of your extension that launches them" if ctx.cuda else "kernel[grid](...)"
        result.checks.append(
            Check(
                "runtime.no_kernel_launch",
                f"None of your {own_kernels(ctx)} was launched during forward. ModelNew.forward must "
                f"launch them ({how}) to compute the output.",
            )
        )
    torch_compute_check(result, ops, ctx)
    changed = [
        str(i)
        for i, (a, b) in enumerate(zip(args, pristine, strict=True))
        if isinstance(a, torch.Tensor) and not _same_tensor_values(a, b)
    ]
    if changed:
        result.checks.append(
            Check(
                "runtime.inputs_modified",
                f"forward modified its input tensor(s) {', '.join(changed)}. Inputs must be left "
                "unchanged; write results to a new output tensor.",
            )
        )
    _stop_if_rejected(result)


def _stop_if_rejected(result: EvalResult) -> None:
    if any(c.severity == "reject" for c in result.checks):
        result.status = STATUS_REJECTED
        raise Stop


def torch_compute_check(result: EvalResult, ops: TorchOpRecorder, ctx: EvalContext) -> None:
    """Every trial, not only the first: a candidate may compute with torch only in calls that look
    like the judge's (its stream busy, see run_candidate), and later trials look like them."""
    compute = ops.compute_ops()
    if compute:  # a first one ends the trials: never added twice
        listed = ", ".join(f"aten.{k} x{v}" for k, v in list(compute.items())[:10])
        result.checks.append(
            Check(
                "runtime.torch_compute",
                f"torch computed part of the result during forward ({listed}), from Python or C++. Only "
                f"allocation, views and copies may use torch; compute everything in your {own_kernels(ctx)}.",
            )
        )


def _same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b)) or bool(
        torch.isnan(a).any() and torch.allclose(a, b, equal_nan=True, rtol=0, atol=0)
    )


def precision_check(
    result: EvalResult,
    ctx: EvalContext,
    ref: Reference,
    out: Any,
    expected: Any,
    max_abs_diff: float | None = None,
) -> None:
    """Reject computing in lower precision than the reference (e.g. bf16 math for an fp32 problem)."""
    prec = ref.precision
    if prec is None:
        return
    hard = ctx.hardening
    over = precision.excess(out, expected, max_abs_diff, prec, hard)
    if over is not None:
        reject(result, "runtime.low_precision", precision.message(*over, prec.dtype, hard.precision_policy))


def _expected(
    result: EvalResult,
    ctx: EvalContext,
    ref: Reference,
    guard: Guard,
    seed: int,
    args: list[Any] | None = None,
) -> Any:
    """The reference's output for `seed`, computed now that the candidate's output for it exists
    (`args`: pristine inputs of `seed`, else regenerated). The caller drops it before the next
    candidate call. Candidate code has run, so first check it left the reference's world intact."""
    with ctx.phase("expected"):  # sub-phase of correctness (its verifications)
        check_not_patched(result, guard)
        if args is None:
            args = loader.make_inputs(ref.module, seed, ctx.device)
        with reference_errors(result, ctx), torch.no_grad(), ref.in_pool():
            out = ref.model(*args)
            sync(ctx.device)
    return out


def _compare(ctx: EvalContext, expected: Any, out: Any, opts: EvalOptions) -> Any:
    """compare_outputs, its time reported as sub-phase `compare` (of correctness)."""
    with ctx.phase("compare"):
        return compare_outputs(expected, out, opts.tolerance)
