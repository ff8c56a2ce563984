"""The first layer: one evaluation's checks in the candidate's process (eval_server/runner serves
it to the judge, which decides the verdict, the timing and the speedup; nothing here times).

Order matters for trust. The reference's float64 precision baseline and its output size are
computed *before* the candidate is imported. Its expected outputs are not kept: no reference
output exists while candidate code runs (nothing to steal from memory, FIELD_NOTES 2026). Each is
computed after the candidate's output for that input exists, from inputs regenerated from the
seed, compared, and dropped before the next candidate call. Since the reference then runs after
candidate code, a snapshot taken before the candidate's import (torch, triton, the evaluator, the
reference module and its classes, global module hooks, active torch modes) must be intact before
every reference run and every verdict. The candidate runs on inputs regenerated from the same
seeds, into poisoned memory, under launch/op/thread recorders: the feedback's first checks.

This module is the list of phases; each lives in its own module: candidate.py (static checks,
CUDA build, loading and running the candidate), reference.py (the reference phase),
verification.py (correctness).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from eval_server.checks.compare import tolerance_for
from eval_server.feedback import build_feedback
from eval_server.pipeline import shapes
from eval_server.pipeline.candidate import cuda_compile_phase, load_candidate, static_phase
from eval_server.pipeline.context import EvalContext
from eval_server.pipeline.reference import reference_phase
from eval_server.pipeline.verdicts import Stop
from eval_server.pipeline.verification import Guard, correctness_phase
from eval_server.schema import STATUS_OK, EvalRequest, EvalResult, result_for


def evaluate(request: EvalRequest, ctx: EvalContext) -> EvalResult:
    """Run the whole pipeline and return a finished result (feedback included)."""
    return first_layer(request, ctx)[0]


def first_layer(request: EvalRequest, ctx: EvalContext) -> tuple[EvalResult, Any]:
    """The pipeline in the candidate's process: its result and the candidate's model (None when
    it never got one). The judge (eval_server/judge) takes the report as the first layer."""
    model: Any = None
    result = result_for(request, STATUS_OK, ctx.device_label)
    t0 = time.perf_counter()
    holder: list[Any] = []
    try:
        _pipeline(request, ctx, result, holder)
    except Stop:
        pass
    if holder:  # whatever the verdict here: the judge's own calls decide (a report can be forged)
        model = holder[0]
    result.phases = dict(ctx.phases)
    result.elapsed_s = round(time.perf_counter() - t0, 6)
    tol = tolerance_for(request.options.tolerance, torch.float32)
    result.feedback = build_feedback(result, tol)
    return result, model


def _pipeline(request: EvalRequest, ctx: EvalContext, result: EvalResult, holder: list[Any]) -> None:
    opts = request.options
    gpu = ctx.device.type == "cuda"
    with ctx.phase("static"):
        static_phase(request, ctx, result)
    cuda = opts.backend == "cuda"
    if cuda and ctx.device.type != "cuda":
        cuda_compile_phase(request, ctx, result)  # ends the evaluation: it cannot run here

    ref = reference_phase(request, ctx, result)
    if ctx.ref_cache is not None:  # written and read only above: no open connection for candidate code
        ctx.ref_cache.close()
        ctx.ref_cache = None
    if cuda:
        cuda_compile_phase(request, ctx, result)  # CPU work: outside the GPU lock
    # imported now: nothing is imported from the evaluation directory once the candidate is loaded
    warm = gpu and ctx.hardening.compile_unlocked
    variant = shapes.import_variant(request.reference, ctx.workdir, "reference_shape") if warm else None

    guard = Guard.snapshot(ref)
    with ctx.phase("load_candidate"), ctx.gpu():
        cand_model = load_candidate(request, ctx, result, ref)
    holder.append(cand_model)

    with ctx.phase("correctness"), ctx.gpu(), torch.no_grad():
        correctness_phase(opts, ctx, result, ref, cand_model, guard)
    if variant is not None:
        with ctx.phase("second_shape_warm"), ctx.gpu(), torch.no_grad():
            shapes.warm(variant[0], cand_model, ctx.device, opts.seed)
    result.status = STATUS_OK
