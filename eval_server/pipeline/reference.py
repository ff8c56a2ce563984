"""The reference phase: everything about the reference that is kept, computed before any candidate
code exists in the process. The reference is loaded into its own memory pool; its facts (float64
precision baseline, output and input bytes, FLOPs of one forward) come from the judge in a served
evaluation (it measured them itself: no file a candidate's process can write decides another
candidate's checks), else from one forward on the first trial's inputs or the reference cache (an
in-process evaluation). (The judge times the reference, in its own process.)

Separate because this phase is the trust boundary of the evaluation: nothing here may run after the
candidate is imported, and no reference output survives it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from eval_server.checks.compare import error_parts, error_ratio, flatten_output, normalized_error
from eval_server.pipeline import loader
from eval_server.pipeline.context import EvalContext, Precision, Reference, sync
from eval_server.pipeline.kernel_time import reference_kernels
from eval_server.pipeline.verdicts import reference_errors
from eval_server.schema import EvalRequest, EvalResult

# Version of what _reference_facts computes (part of its cache key: a change makes old entries misses).
REFERENCE_FACTS_VERSION = 2  # 2: the profiled forward's device activities (kernels)


def _reference_pool(device: torch.device) -> tuple[Any, Any]:
    """(pool, context manager): on CUDA the reference allocates in its own memory pool, so no
    block that ever held reference data is handed to the candidate by the caching allocator."""
    if device.type == "cuda" and hasattr(torch.cuda, "MemPool"):
        pool = torch.cuda.MemPool()
        return pool, lambda: torch.cuda.use_mem_pool(pool, device=device)
    return None, contextlib.nullcontext


def facts_cache_key(problem: str, device: torch.device, seed: int, precision_policy: str) -> dict[str, Any]:
    """The reference cache's key parts of a problem's facts (an in-process evaluation's)."""
    return {
        "problem": problem,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "torch": torch.__version__,
        "seed": seed,
        "precision_policy": precision_policy,
        "facts": REFERENCE_FACTS_VERSION,
    }


def reference_phase(request: EvalRequest, ctx: EvalContext, result: EvalResult) -> Reference:
    """Everything about the reference that is kept, computed before any candidate code exists here.
    The first trial's output gives the precision baseline and the output size, then is dropped."""
    opts = request.options
    device = ctx.device
    seeds = [opts.seed + i for i in range(opts.correctness_trials)]
    pool, in_pool = _reference_pool(device)
    facts_key = facts_cache_key(result.problem_hash, device, seeds[0], ctx.hardening.precision_policy)
    with ctx.phase("reference"), ctx.gpu(), torch.no_grad():
        with reference_errors(result, ctx):
            module = loader.import_source(request.reference, ctx.workdir, "reference")
            with in_pool():
                init_inputs = loader.make_init_inputs(module, opts.seed, device)
                model = loader.build_model(module.Model, init_inputs, opts.seed, device)
        facts = _given_facts(ctx, module, model, seeds[0], result, in_pool)
        if facts is None:
            facts = _cached_facts(ctx, facts_key)
        if facts is None:
            facts = _reference_facts(module, model, seeds[0], ctx, result, in_pool)
            if ctx.ref_cache is not None:
                ctx.ref_cache.put_facts(facts_key, facts.to_json())
    ref = Reference(
        module=module,
        model=model,
        init_inputs=init_inputs,
        seeds=seeds,
        precision=facts.precision,
        output_bytes=facts.output_bytes,
        input_bytes=facts.input_bytes,
        flops=facts.flops,
        kernels=facts.kernels,
        pool=pool,
        in_pool=in_pool,
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()  # float64 copies: give the memory back
    return ref


@dataclass(frozen=True)
class _Facts:
    """What the reference phase learns from the first trial's output; a pure function of the
    problem, seed, device, torch and precision policy, so it is cached (ref_cache.py)."""

    precision: Precision | None
    output_bytes: int
    input_bytes: int
    flops: int
    # one profiled forward's device time and largest activities (kernel_time.reference_kernels;
    # None off CUDA or without kernel profiling)
    kernels: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> _Facts:
        p = d["precision"]
        return cls(
            precision=None if p is None else Precision(**p),
            output_bytes=int(d["output_bytes"]),
            input_bytes=int(d["input_bytes"]),
            flops=int(d["flops"]),
            kernels=d.get("kernels"),
        )


def judge_facts(
    precision: dict[str, Any] | None, output_bytes: int, input_bytes: int, flops: int
) -> dict[str, Any]:
    """The facts a judge hands the candidate's process (EvalContext.given_facts); `precision`:
    judge/precision.py's facts ({} or None: none)."""
    return {
        "precision": precision or None,
        "output_bytes": output_bytes,
        "input_bytes": input_bytes,
        "flops": flops,
    }


def _given_facts(
    ctx: EvalContext,
    module: Any,
    model: torch.nn.Module,
    seed: int,
    result: EvalResult,
    in_pool: Callable[[], Any],
) -> _Facts | None:
    """The judge's facts (None when it gave none), with this process's profile of the reference's
    forward beside them: the profile is only shown in feedback, and measured here it comes from no
    file another candidate's process could have written."""
    if ctx.given_facts is None:
        return None
    kernels = None
    if ctx.device.type == "cuda" and ctx.hardening.profile_kernels:
        with ctx.phase("reference_profile"), reference_errors(result, ctx):
            args = loader.make_inputs(module, seed, ctx.device)
            with in_pool():
                model(*args)  # warm: the profiled forward is a second one, as in _reference_facts
                kernels = _profile_forward(model, args, ctx.device)
            del args
    return _Facts.from_json({**ctx.given_facts, "kernels": kernels})


def _cached_facts(ctx: EvalContext, key: dict[str, Any]) -> _Facts | None:
    """The reference's facts from the cache; None on a miss or an entry this version cannot read."""
    raw = ctx.ref_cache.get_facts(key) if ctx.ref_cache is not None else None
    if raw is None:
        return None
    try:
        return _Facts.from_json(raw)
    except (KeyError, TypeError, ValueError):
        return None


def _reference_facts(
    module: Any,
    model: torch.nn.Module,
    seed: int,
    ctx: EvalContext,
    result: EvalResult,
    in_pool: Callable[[], Any],
) -> _Facts:
    """One forward on the first trial's inputs (counting FLOPs), then the float64 pass against it
    (sub-phase reference_precision); the output is dropped before any candidate code exists."""
    device = ctx.device
    with reference_errors(result, ctx):
        args = loader.make_inputs(module, seed, device)
        with in_pool():
            first, flops = forward_counting_flops(model, args)
        input_bytes = nbytes(args)
        sync(device)
    kernels = None
    if device.type == "cuda" and ctx.hardening.profile_kernels:
        with ctx.phase("reference_profile"), in_pool():  # sub-phase of reference
            kernels = _profile_forward(model, args, device)
    del args
    with ctx.phase("reference_precision"):  # sub-phase of reference: the float64 pass
        precision = precision_baseline(module, model, seed, first, device, ctx.hardening.precision_policy)
    return _Facts(
        precision=precision,
        output_bytes=nbytes(first),
        input_bytes=input_bytes,
        flops=flops,
        kernels=kernels,
    )


def _profile_forward(model: torch.nn.Module, args: list[Any], device: torch.device) -> dict[str, Any] | None:
    """Where a (second, warm) reference forward's GPU time goes, by CUPTI: what the candidate's
    kernel_time is shown beside (its bottleneck first). Best effort: None when profiling fails."""
    from eval_server.checks.runtime import profile_device_activity

    times: list[tuple[str, float]] = []
    try:
        out, _, _ = profile_device_activity(lambda: model(*args), device, times)
    except Exception:  # noqa: BLE001 - the reference ran once already; this is a report, not a check
        return None
    del out
    return reference_kernels(times)


def forward_counting_flops(model: torch.nn.Module, args: list[Any]) -> tuple[Any, int]:
    """One forward, and the FLOPs torch's counter sees in it (matmuls, convolutions, attention);
    when the counter cannot trace an op, the forward runs plainly and the count is 0 (the physics
    floor then rests on bytes alone)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter:
            out = model(*args)
        return out, int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - an op the counter cannot trace (the reference's own errors recur below)
        return model(*args), 0


def _leaves(obj: Any) -> list[torch.Tensor]:
    return [leaf for _, leaf in flatten_output(obj) if isinstance(leaf, torch.Tensor)]


def nbytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) output or argument list."""
    return sum(t.numel() * t.element_size() for t in _leaves(obj))


def _round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to a 10-bit mantissa (tf32 / fp16 precision, fp32 range)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).view(t.shape)


def precision_baseline(
    module: Any, model: torch.nn.Module, seed: int, out32: Any, device: torch.device, policy: str
) -> Precision | None:
    """The float64 truth for the first trial and the error budget a candidate is held to.

    Policy "fp32": the candidate may be as far from float64 as the fp32 reference itself is
    (times a factor: summation order differs). Policy "tf32": as far as the reference computed
    on inputs and weights rounded to a 10-bit mantissa (what tf32 tensor cores or fp16 storage
    do). None when the problem has no floating output or an op lacks a float64 kernel.
    """
    try:
        args = loader.make_inputs(module, seed, device)
        model64 = copy.deepcopy(model).to(torch.float64)
        out64 = model64(
            *[
                a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args
            ]
        )
        del model64
        parts = error_parts(out32, out64)
        if parts is None:
            return None
        diff64, mag64 = parts
        ref_error = error_ratio(diff64, mag64)
        budget = ref_error
        if policy == "tf32":
            model_r = copy.deepcopy(model)
            for p in list(model_r.parameters()) + list(model_r.buffers()):
                if p.dtype == torch.float32:
                    p.data = _round_to_tf32(p.data)
            rounded = [
                _round_to_tf32(a) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                for a in args
            ]
            budget = max(budget, normalized_error(model_r(*rounded), out64) or 0.0)
            del model_r, rounded
        first = next((t for t in _leaves(out32) if t.is_floating_point()), None)
        if first is None:
            return None
        del out64  # not kept: a KernelBench output in float64 can be 10+ GB
        return Precision(
            ref_error=ref_error,
            budget=budget,
            dtype=str(first.dtype).removeprefix("torch."),
            ref_scale=max(0.0, mag64 - diff64),  # |r32| >= |r64| - |r32 - r64|
        )
    except Exception:  # noqa: BLE001 - some ops have no float64 kernel; the check is then skipped
        return None
