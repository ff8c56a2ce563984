"""How a phase ends an evaluation early: `Stop` (a verdict was reached), `reject` (a check fired),
and the statuses and error texts of exceptions raised by candidate or reference code.

Separate because every phase ends evaluations the same way, and which exception means a compile
error, a runtime error or a device fault must be decided in one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from eval_server.isolation.audit import interpreter_hooks
from eval_server.pipeline import loader
from eval_server.pipeline.context import EvalContext
from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    Check,
    EvalResult,
)


class Stop(Exception):
    """Internal: the pipeline reached a verdict early."""


def reject(result: EvalResult, check_id: str, message: str) -> None:
    result.checks.append(Check(check_id, message))
    result.status = STATUS_REJECTED
    result.correct = False
    raise Stop


# What a fault of code that already ran on the device says (torch.AcceleratorError, Triton's
# "Triton Error [CUDA]: ..." from a later launch, cudaErrorIllegalAddress, device-side asserts).
_DEVICE_FAULT = re.compile(
    r"illegal memory access|illegal address|illegal instruction|misaligned address|CUDA error|"
    r"Triton Error \[CUDA\]|CUDA_ERROR_|cudaError|device-side assert|unspecified launch failure|"
    r"HIP error|hipError",
    re.IGNORECASE,
)


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes/contexts, outermost first (a wrapper can hide the real failure)."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain and len(chain) < 16:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


def _is_device_fault(exc: BaseException) -> bool:
    """A CUDA/HIP error: raised only once device code has run, so never a compile error."""
    if type(exc).__name__ in ("AcceleratorError", "CudaError"):
        return True
    # A Triton CompilationError's text quotes the kernel's source (whose comments may say anything):
    # read only its own error message.
    own = getattr(exc, "error_message", None)
    return bool(_DEVICE_FAULT.search(own if isinstance(own, str) else str(exc)))


def device_faulted(exc: BaseException) -> bool:
    """Whether `exc` or anything in its cause/context chain is a device fault."""
    return any(_is_device_fault(e) for e in _exception_chain(exc))


def _is_triton_compile_error(exc: BaseException) -> bool:
    """Triton's own compile failures (front end, ptxas, resource limits at load), which surface
    at a kernel's first launch before it runs."""
    mod = type(exc).__module__ or ""
    if not mod.startswith("triton"):
        return False
    names = {t.__name__ for t in type(exc).__mro__}
    return (
        bool(names & {"CompilationError", "PTXASError", "OutOfResources"}) or "Compil" in type(exc).__name__
    )


def classify_forward_error(exc: BaseException) -> str:
    """Status of an exception raised while running the candidate's forward.

    compile_error only for a Triton compilation failure at first launch; anything that shows a
    device fault anywhere in its chain (even under a Triton wrapper, e.g. a later kernel's first
    launch failing in a poisoned CUDA context) and everything else is runtime_error.
    """
    if device_faulted(exc):
        return STATUS_RUNTIME_ERROR
    return STATUS_COMPILE_ERROR if _is_triton_compile_error(exc) else STATUS_RUNTIME_ERROR


def error_info(exc: BaseException, ctx: EvalContext) -> dict[str, str]:
    """The result's `error` for `exc`: type, message and the traceback's tail in the model's files."""
    error = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": loader.format_exception_tail(exc, ctx.workdir),
    }
    share = ctx.hardening.gpu_memory_fraction
    if isinstance(exc, torch.OutOfMemoryError) and share < 1.0:
        note = f"This evaluation may allocate {share:.0%} of the GPU's memory (the GPU is shared by several evaluations)."
        error["message"] = f"{note} {error['message']}"
        error["traceback"] = f"{error['traceback']}\n{note}"
    return error


@contextmanager
def candidate_code(result: EvalResult, ctx: EvalContext) -> Iterator[None]:
    """Run candidate code: an exception it raises ends the evaluation with its classified status
    (verdicts of the evaluator's own checks, `Stop`, pass through)."""
    hooks = interpreter_hooks()
    try:
        yield
    except Stop:
        raise
    except Exception as exc:
        result.status = classify_forward_error(exc)
        result.compiled = result.status != STATUS_COMPILE_ERROR
        result.correct = False
        result.error = error_info(exc, ctx)
        raise Stop from None
    if interpreter_hooks() != hooks:
        reject(
            result,
            "runtime.interpreter_hooks",
            "The candidate left a trace, profile or monitoring hook installed. Do not hook the "
            "interpreter: write the kernel and call it.",
        )


@contextmanager
def reference_errors(result: EvalResult, ctx: EvalContext) -> Iterator[None]:
    """An exception of the reference's own code ends the evaluation as reference_error."""
    try:
        yield
    except Exception as exc:
        result.status = STATUS_REFERENCE_ERROR
        result.correct = False
        result.error = error_info(exc, ctx)
        raise Stop from None
