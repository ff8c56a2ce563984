"""The candidate's phases up to its output: the static checks of its source, the CUDA build
(backend "cuda"), its import and construction, and one forward under the recorders (launches,
torch ops, threads, device activity) into poisoned memory.

Separate from verification.py: these phases say whether and how candidate code ran; whether
what it produced is right is decided there.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import torch

from eval_server.checks import cuda_symbols
from eval_server.checks.cuda_static import CUDA_RULES
from eval_server.checks.runtime import (
    TorchOpRecorder,
    classify_kernels,
    is_triton_kernel,
    poison_free_memory,
    profile_device_activity,
    python_threads,
)
from eval_server.checks.static import RULES, run_static_checks
from eval_server.pipeline import cuda_backend, loader
from eval_server.pipeline.context import LAUNCHES, THREADS, EvalContext, Reference, sync
from eval_server.pipeline.kernel_time import kernel_time
from eval_server.pipeline.verdicts import Stop, candidate_code, device_faulted, error_info, reject
from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_UNSUPPORTED,
    EvalRequest,
    EvalResult,
)

_BUSY_CYCLES = 2_000_000  # GPU clock cycles of the sleep queued ahead of each trial: ~1 ms at ~2 GHz


def static_phase(request: EvalRequest, ctx: EvalContext, result: EvalResult) -> None:
    try:
        tree = ast.parse(request.candidate, filename="candidate.py")
    except SyntaxError as exc:
        result.status = STATUS_COMPILE_ERROR
        result.error = {
            "type": "SyntaxError",
            "message": str(exc),
            "traceback": loader.format_exception_tail(exc, ctx.workdir),
        }
        raise Stop from None
    ctx.candidate_functions = frozenset(
        n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    )
    result.checks.extend(run_static_checks(tree, CUDA_RULES if request.options.backend == "cuda" else RULES))
    if any(c.severity == "reject" for c in result.checks):
        result.status = STATUS_REJECTED
        raise Stop


def cuda_compile_phase(request: EvalRequest, ctx: EvalContext, result: EvalResult) -> None:
    """Backend "cuda": build the candidate's load_inline extensions in a compile process (no GPU
    lock held), then point load_inline at the builds. Without a GPU the sources are only compiled
    and the evaluation ends `unsupported`."""
    on_gpu = ctx.device.type == "cuda"
    if on_gpu:
        cuda_backend.prepare_gpu_build(ctx.device)
    cache = ctx.build_cache or ctx.workdir / "cuda-ext"
    with ctx.phase("compile"):
        report = cuda_backend.compile_candidate(
            request.candidate, ctx.workdir, cache, ctx.hardening.cuda_compile_timeout_s, build=on_gpu
        )
    result.compiled = report.compiled > 0
    if report.checks:
        result.checks.extend(report.checks)
        result.status = STATUS_REJECTED
        raise Stop
    if report.error is not None:
        result.status = STATUS_COMPILE_ERROR
        result.compiled = False
        result.error = {"type": "CudaCompileError", "message": report.error, "traceback": ""}
        raise Stop
    if report.import_error is not None and not on_gpu:  # on a GPU the evaluation's import says it
        result.status = STATUS_COMPILE_ERROR
        result.error = {"type": "ImportError", "message": "", "traceback": report.import_error}
        raise Stop
    if report.unsupported is not None or not on_gpu:
        result.status = STATUS_UNSUPPORTED
        why = report.unsupported or (
            f"the candidate passed the static checks and its sources compiled ({report.compiled} "
            "extension(s), compile check only), but this worker has no GPU to run them"
            if report.compiled
            else "this worker has no GPU, and the compile check ended without a result"
        )
        result.error = {
            "type": "Unsupported",
            "message": f"The CUDA backend cannot be evaluated on this worker: {why}. Correctness and "
            "speed were not measured.",
            "traceback": "",
        }
        raise Stop
    for key in report.keys:  # before anything of them is loaded: their constructors are native code
        for library in cuda_backend.libraries(cache / key):
            check = cuda_symbols.check_build(library, cuda_backend.objects(cache / key), cuda_backend.cxx())
            if check is not None:
                result.checks.append(check)
                result.status = STATUS_REJECTED
                raise Stop
    ctx.cuda = cuda_backend.Extensions(cache, checked=report.keys).install()


def load_candidate(request: EvalRequest, ctx: EvalContext, result: EvalResult, ref: Reference) -> Any:
    try:
        module = loader.import_source(request.candidate, ctx.workdir, "candidate")
    except Exception as exc:
        # A kernel launched at import that faults on the device ran: that is not a compile error.
        result.status = STATUS_RUNTIME_ERROR if device_faulted(exc) else STATUS_COMPILE_ERROR
        result.error = error_info(exc, ctx)
        raise Stop from None
    model_cls = getattr(module, "ModelNew", None)
    if not isinstance(model_cls, type):
        result.status = STATUS_COMPILE_ERROR
        result.error = {
            "type": "MissingModelNew",
            "message": "The module does not define a class named ModelNew.",
            "traceback": "",
        }
        raise Stop
    try:
        with torch.no_grad():
            model = loader.build_model(
                model_cls, loader.clone_args(ref.init_inputs), request.options.seed, ctx.device
            )
    except Exception as exc:
        result.status = STATUS_RUNTIME_ERROR
        result.compiled = True
        result.error = error_info(exc, ctx)
        raise Stop from None
    result.compiled = True
    return model


def run_candidate(
    model: Callable[..., Any],
    args: list[Any],
    ctx: EvalContext,
    result: EvalResult,
    poison_bytes: int,
    profile: bool = False,
) -> tuple[Any, TorchOpRecorder, int | None]:
    """One forward under the recorders, into poisoned memory; errors end the evaluation. Returns
    the output, the torch ops it ran and how many of the candidate's own kernels it launched
    (profiled: as CUPTI saw them; otherwise Triton's launch recorder, None for backend "cuda")."""
    with ctx.phase("poison"):  # sub-phase of correctness, reported separately for tuning
        poison_free_memory(poison_bytes, ctx.device)
    if ctx.device.type == "cuda":
        # The judge's calls find the stream still waiting for its "go"; these must look the same, so a
        # candidate that asks whether its stream is idle to tell the two apart (and computes with
        # torch where it thinks it is timed) does so here, under the recorders (`timed_lead_aten`).
        torch.cuda._sleep(_BUSY_CYCLES)
    ops = TorchOpRecorder()
    LAUNCHES.reset()
    threads_before = python_threads()
    device_activity: list[str] = []
    off_stream: list[str] = []
    times: list[tuple[str, float]] = []
    with candidate_code(result, ctx):
        with LAUNCHES.recording(ops), THREADS.recording(), ops:
            if profile:
                with ctx.phase("kernel_profile"):  # sub-phase of correctness
                    out, device_activity, off_stream = profile_device_activity(
                        lambda: model(*args), ctx.device, times
                    )
            else:
                out = model(*args)
        sync(ctx.device)
    # CUPTI's count when profiled (the launch recorder lives where candidate code can reach it),
    # else the recorder's (Triton)
    launches = None
    if profile:
        is_own = own_kernel_test(result, ctx)
        launches = sum(1 for name in device_activity if is_own(name))
        if times:
            result.kernel_time = kernel_time(times, is_own)
    if launches is None and ctx.cuda is None:
        launches = LAUNCHES.count
    if device_activity:
        device_activity_checks(result, device_activity, off_stream, ctx)
    new_threads = python_threads() - threads_before
    if THREADS.started or new_threads > 0:
        where = ", ".join(THREADS.started[:3]) or "a thread still running after forward returned"
        reject(
            result,
            "runtime.threads",
            f"forward started threads ({where}). All work must happen inside forward, on the calling "
            "thread, in Triton kernels.",
        )
    return out, ops, launches


def own_kernels(ctx: EvalContext) -> str:
    """How the feedback names the candidate's own kernels, by backend."""
    return (
        "CUDA kernels (the __global__ functions of your load_inline sources)"
        if ctx.cuda
        else "Triton kernels"
    )


def _some(names: list[str], n: int) -> str:
    return "; ".join(sorted({name[:90] for name in names})[:n])


def triton_kernel_names(result: EvalResult, ctx: EvalContext) -> tuple[str, ...]:
    """The Triton functions the launch recorder saw, each one a function the candidate's source
    defines: the recorder lives in the evaluation process, where candidate code could add names
    to it (a library kernel's name would make that kernel the candidate's own)."""
    names = tuple(n for n in LAUNCHES.launches if n)
    defined = ctx.candidate_functions
    forged = sorted(set(names) - defined) if defined is not None else []
    if forged:
        reject(
            result,
            "runtime.evaluator_state",
            f"The evaluator's record of your kernel launches names functions your source does not define "
            f"({', '.join(repr(n[:60]) for n in forged[:3])}): it was modified. Leave the evaluator's objects alone.",
        )
    return names


def own_kernel_test(result: EvalResult, ctx: EvalContext) -> Callable[[str], bool]:
    """Whether a recorded activity name is one of the candidate's own kernels (its Triton
    functions, or its extension's __global__ kernels)."""
    if ctx.cuda is not None:
        return ctx.cuda.owns
    triton = triton_kernel_names(result, ctx)
    return lambda name: is_triton_kernel(name, triton)


def own_kernel_count(result: EvalResult, names: list[str], ctx: EvalContext) -> int:
    """How many of the recorded kernels `names` are the candidate's own (its Triton functions, or
    its extension's __global__ kernels)."""
    is_own = own_kernel_test(result, ctx)
    return sum(1 for name in names if is_own(name))


def device_activity_checks(
    result: EvalResult,
    names: list[str],
    off_stream: list[str],
    ctx: EvalContext,
    when: str = "during forward",
) -> None:
    """Reject device activity that is not the candidate's own kernels (copies and fills allowed),
    work on another stream, and copies to the host, recorded `when`."""
    own = ctx.cuda.owns if ctx.cuda is not None else None
    foreign, to_host = classify_kernels(names, triton_kernel_names(result, ctx), own)
    if foreign:
        reject(
            result,
            "runtime.foreign_kernels",
            f"GPU kernels other than your {own_kernels(ctx)} computed {when} ({len(foreign)} launches, "
            f"e.g. {_some(foreign, 5)}): torch or a library did the work. Compute everything in your own kernels.",
        )
    if off_stream:
        reject(
            result,
            "runtime.side_stream",
            f"forward ran GPU work on another CUDA stream than the current one {when} ({len(off_stream)} "
            f"activities, e.g. {_some(off_stream, 3)}): timing and checks follow the current stream. "
            "Launch every kernel on it.",
        )
    if to_host:
        reject(
            result,
            "runtime.host_roundtrip",
            f"forward copied data from the GPU to the host {when} ({len(to_host)} copies): computing on the "
            "CPU is not allowed and synchronizes the device. Keep the computation in Triton kernels on the GPU.",
        )
