"""Unit tests of verdicts.classify_forward_error: which exceptions from candidate code are a
compile_error (a Triton compile failure before any kernel ran) and which a runtime_error (the
code ran: CUDA faults, even when a Triton exception wraps them, and everything else)."""

from __future__ import annotations

import ast

import pytest
import torch
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure, UnsupportedLanguageConstruct
from triton.runtime.errors import OutOfResources, PTXASError

from eval_server.pipeline.verdicts import classify_forward_error

pytestmark = pytest.mark.unit

ILLEGAL = "CUDA error: an illegal memory access was encountered"


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    """`outer` raised `from cause`, as a wrapper inside Triton or torch would."""
    outer.__cause__ = cause
    return outer


def compilation_error(message: str, src: str = "def k(x):\n    return x\n") -> CompilationError:
    node = ast.parse(src).body[0].body[-1]  # the last line of the kernel: the excerpt quotes all above
    return CompilationError(src, node, message)


def accelerator_error() -> BaseException:
    """torch.AcceleratorError where this torch has it (2.8+), else a same-named stand-in."""
    cls = getattr(torch, "AcceleratorError", None) or type("AcceleratorError", (RuntimeError,), {})
    try:
        return cls(ILLEGAL)
    except TypeError:  # pragma: no cover - a constructor with another signature
        return type("AcceleratorError", (RuntimeError,), {})(ILLEGAL)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError(ILLEGAL),
        RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
        RuntimeError("CUDA error: misaligned address\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("CUDA error: unspecified launch failure"),
        accelerator_error(),
        ValueError("shapes (4,) and (5,) do not match"),
        IndexError("index 7 is out of bounds"),
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        # The reported bug: a Triton compile-named exception that only carries a device fault
        # (a later kernel's first launch in a poisoned CUDA context).
        compilation_error(ILLEGAL),
        chained(compilation_error("could not load the module"), RuntimeError(ILLEGAL)),
        chained(PTXASError("ptxas failed"), RuntimeError("Triton Error [CUDA]: illegal address")),
    ],
    ids=lambda e: f"{type(e).__name__}:{str(e)[:30]}",
)
def test_faults_and_ordinary_exceptions_while_running_are_runtime_errors(exc):
    assert classify_forward_error(exc) == "runtime_error"


@pytest.mark.parametrize(
    "exc",
    [
        compilation_error("unsupported AST node type: Try"),
        CompileTimeAssertionFailure("def k():\n    pass\n", None, "static_assert failed"),
        UnsupportedLanguageConstruct(None, None, "while-else is not supported"),
        PTXASError("ptxas fatal: Unresolved extern function"),
        OutOfResources(required=300000, limit=232448, name="shared memory"),
        chained(compilation_error("incompatible types"), TypeError("bad operand")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_triton_compile_failures_are_compile_errors(exc):
    assert classify_forward_error(exc) == "compile_error"


def test_kernel_source_quoted_by_a_compile_error_does_not_make_it_a_fault():
    """CompilationError's text quotes the kernel; a comment there mentioning CUDA errors must not
    turn a real compile failure into a runtime_error."""
    src = "def k(x):\n    # guard against a CUDA error: illegal memory access\n    return x\n"
    exc = compilation_error("unsupported AST node type: Try", src)
    assert "illegal memory access" in str(exc)
    assert classify_forward_error(exc) == "compile_error"


def test_a_cycle_in_the_exception_chain_terminates():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert classify_forward_error(a) == "runtime_error"
