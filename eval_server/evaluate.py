"""One evaluation, start to finish, inside a disposable process (see worker.py).

Order matters for trust: the reference is loaded and run on every trial's inputs *before* the
candidate is imported, so a candidate cannot influence reference outputs; the candidate runs on
fresh clones of the inputs; the namespace snapshot taken before the candidate import detects
monkey-patching before any verdict or timing is accepted.
"""

from __future__ import annotations

import ast
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eval_server import loader
from eval_server.compare import compare_outputs, tolerance_for
from eval_server.feedback import build_feedback
from eval_server.runtime_checks import (
    LaunchRecorder,
    NamespaceSnapshot,
    TorchOpRecorder,
    default_guarded_namespaces,
)
from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_INCORRECT,
    STATUS_OK,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    Check,
    EvalRequest,
    EvalResult,
    TrialResult,
    problem_hash,
)
from eval_server.static_checks import run_static_checks
from eval_server.timing import l2_flush_buffer, time_gpu

# Installed once in the warm parent and inherited by every forked evaluation.
LAUNCHES = LaunchRecorder()


@dataclass
class EvalContext:
    device: torch.device
    device_label: str
    workdir: Path
    timing_enabled: bool  # False on CPU / interpreter workers
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - t0, 6)


class _Stop(Exception):
    """Internal: the pipeline reached a verdict early."""


def _is_triton_compile_error(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    return mod.startswith("triton") and "Compil" in type(exc).__name__


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _error(exc: BaseException, ctx: EvalContext) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": loader.format_exception_tail(exc, ctx.workdir),
    }


def evaluate(request: EvalRequest, ctx: EvalContext) -> EvalResult:
    """Run the whole pipeline and return a finished result (feedback included)."""
    result = EvalResult(
        status=STATUS_OK,
        device=ctx.device_label,
        problem_hash=problem_hash(request.reference),
        problem_id=request.problem_id,
        request_id=request.request_id,
    )
    t0 = time.perf_counter()
    try:
        _pipeline(request, ctx, result)
    except _Stop:
        pass
    result.phases = dict(ctx.phases)
    result.elapsed_s = round(time.perf_counter() - t0, 6)
    tol = tolerance_for(request.options.tolerance, torch.float32)
    result.feedback = build_feedback(result, tol)
    return result


def _pipeline(request: EvalRequest, ctx: EvalContext, result: EvalResult) -> None:
    opts = request.options
    device = ctx.device

    # 1. Static checks (no candidate code runs).
    with ctx.phase("static"):
        try:
            tree = ast.parse(request.candidate, filename="candidate.py")
        except SyntaxError as exc:
            result.status = STATUS_COMPILE_ERROR
            result.error = {
                "type": "SyntaxError",
                "message": str(exc),
                "traceback": loader.format_exception_tail(exc, ctx.workdir),
            }
            raise _Stop from None
        result.checks.extend(run_static_checks(tree))
        if any(c.severity == "reject" for c in result.checks):
            result.status = STATUS_REJECTED
            raise _Stop

    # 2. Reference: load, build, run every trial before the candidate exists in this process.
    seeds = [opts.seed + i for i in range(opts.correctness_trials)]
    with ctx.phase("reference"), torch.no_grad():
        try:
            ref_mod = loader.import_source(request.reference, ctx.workdir, "reference")
            init_inputs = loader.make_init_inputs(ref_mod, opts.seed, device)
            ref_model = loader.build_model(ref_mod.Model, init_inputs, opts.seed, device)
            trial_inputs = [loader.make_inputs(ref_mod, s, device) for s in seeds]
            ref_outputs = [ref_model(*loader.clone_args(x)) for x in trial_inputs]
            _sync(device)
        except Exception as exc:
            result.status = STATUS_REFERENCE_ERROR
            result.error = _error(exc, ctx)
            raise _Stop from None

    # 3. Candidate: import (compile errors), construct with the same init inputs and seed.
    snapshot = NamespaceSnapshot(default_guarded_namespaces())
    with ctx.phase("load_candidate"):
        try:
            cand_mod = loader.import_source(request.candidate, ctx.workdir, "candidate")
        except Exception as exc:
            result.status = STATUS_COMPILE_ERROR
            result.error = _error(exc, ctx)
            raise _Stop from None
        model_cls = getattr(cand_mod, "ModelNew", None)
        if not isinstance(model_cls, type):
            result.status = STATUS_COMPILE_ERROR
            result.error = {
                "type": "MissingModelNew",
                "message": "The module does not define a class named ModelNew.",
                "traceback": "",
            }
            raise _Stop
        try:
            with torch.no_grad():
                cand_model = loader.build_model(model_cls, loader.clone_args(init_inputs), opts.seed, device)
        except Exception as exc:
            result.status = STATUS_RUNTIME_ERROR
            result.compiled = True
            result.error = _error(exc, ctx)
            raise _Stop from None
        result.compiled = True

    # 4. Correctness trials with runtime evidence.
    with ctx.phase("correctness"), torch.no_grad():
        for i, (seed, inputs, ref_out) in enumerate(zip(seeds, trial_inputs, ref_outputs, strict=True)):
            args = loader.clone_args(inputs)
            ops = TorchOpRecorder()
            LAUNCHES.reset()
            try:
                with LAUNCHES.recording(), ops:
                    out = cand_model(*args)
                _sync(device)
            except Exception as exc:
                result.status = (
                    STATUS_COMPILE_ERROR if _is_triton_compile_error(exc) else STATUS_RUNTIME_ERROR
                )
                result.compiled = result.status != STATUS_COMPILE_ERROR
                result.error = _error(exc, ctx)
                raise _Stop from None
            if i == 0:
                result.kernel_launches = LAUNCHES.count
                _runtime_checks(result, ops, args, inputs)
                if result.status == STATUS_REJECTED:
                    raise _Stop
            cmp = compare_outputs(ref_out, out, opts.tolerance)
            result.trials.append(
                TrialResult(seed, cmp.passed, cmp.max_abs_diff, cmp.max_rel_diff, cmp.mismatch, cmp.detail)
            )
        patched = snapshot.changed()
        if patched:
            result.checks.append(
                Check(
                    "runtime.monkey_patch",
                    "The candidate replaced functions the evaluator relies on: "
                    + ", ".join(patched[:8])
                    + ". Do not modify torch, triton or time at import or run time.",
                )
            )
            result.status = STATUS_REJECTED
            raise _Stop
        diffs = [t.max_abs_diff for t in result.trials if t.max_abs_diff is not None]
        rels = [t.max_rel_diff for t in result.trials if t.max_rel_diff is not None]
        result.max_abs_diff = max(diffs) if diffs else None
        result.max_rel_diff = max(rels) if rels else None
        if not all(t.passed for t in result.trials):
            result.status = STATUS_INCORRECT
            raise _Stop
        result.correct = True

    # 5. Timing (GPU only): same method, same worker, same inputs for both models.
    if ctx.timing_enabled and opts.timing and device.type == "cuda":
        with ctx.phase("timing"):
            try:
                flush = l2_flush_buffer(device)
                sets = trial_inputs[: max(1, min(3, len(trial_inputs)))]
                kw: dict[str, Any] = {
                    "trials": opts.timing_trials,
                    "warmup": opts.warmup_trials,
                    "device": device,
                }
                result.reference_timing = time_gpu(ref_model, sets, flush=flush, **kw)
                cand_sets = [loader.clone_args(s) for s in sets]
                result.candidate_timing = time_gpu(cand_model, cand_sets, flush=flush, **kw)
            except Exception as exc:
                result.status = STATUS_RUNTIME_ERROR
                result.correct = False
                result.error = _error(exc, ctx)
                raise _Stop from None
            cand_ms = result.candidate_timing.median_ms
            if cand_ms > 0 and math.isfinite(cand_ms):
                result.speedup = result.reference_timing.median_ms / cand_ms
    result.status = STATUS_OK


def _runtime_checks(result: EvalResult, ops: TorchOpRecorder, args: list[Any], pristine: list[Any]) -> None:
    if result.kernel_launches == 0:
        result.checks.append(
            Check(
                "runtime.no_kernel_launch",
                "No Triton kernel was launched during forward. ModelNew.forward must launch your "
                "@triton.jit kernel(s) (kernel[grid](...)) to compute the output.",
            )
        )
    compute = ops.compute_ops()
    if compute:
        listed = ", ".join(f"aten.{k} x{v}" for k, v in list(compute.items())[:10])
        result.checks.append(
            Check(
                "runtime.torch_compute",
                f"torch computed part of the result during forward ({listed}). Only allocation, "
                "views and copies may use torch; compute everything in Triton kernels.",
            )
        )
    changed = [
        str(i)
        for i, (a, b) in enumerate(zip(args, pristine, strict=True))
        if isinstance(a, torch.Tensor) and not _same_tensor_values(a, b)
    ]
    if changed:
        result.checks.append(
            Check(
                "runtime.inputs_modified",
                f"forward modified its input tensor(s) {', '.join(changed)}. Inputs must be left unchanged; "
                "write results to a new output tensor.",
            )
        )
    if any(c.severity == "reject" for c in result.checks):
        result.status = STATUS_REJECTED


def _same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b)) or bool(
        torch.isnan(a).any() and torch.allclose(a, b, equal_nan=True, rtol=0, atol=0)
    )
