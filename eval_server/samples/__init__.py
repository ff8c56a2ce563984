"""Bundled sample corpus: a few KernelBench-format problems and candidates with known outcomes.

`problems/<name>.py` are reference problems (Model, get_inputs, get_init_inputs; small fp32 shapes,
no device arguments). `candidates/<problem>__<variant>.py` are candidate sources defining ModelNew:
one correct Triton solution per problem plus one candidate for each way an evaluation can go wrong
(wrong math, wrong shape, syntax error, runtime error, anti-cheat rejections, timeout, crash), and
CUDA_SAMPLE_CASES: the relu problem in KernelBench's CUDA format (backend "cuda").
SAMPLE_CASES pairs each candidate with its problem and the status the evaluator must report, so
the corpus serves as a smoke test of a deployed service and as fixtures for the tests.

Both folders are package data (not packages) and are read with importlib.resources, so this works
from a source checkout and from an installed wheel alike.

May import: eval_server.schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_CRASHED,
    STATUS_INCORRECT,
    STATUS_OK,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_TIMEOUT,
)

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only needed for the annotation
    from importlib.resources.abc import Traversable

__all__ = [
    "CUDA_SAMPLE_CASES",
    "SAMPLE_CASES",
    "SampleCase",
    "candidate_names",
    "WRONG_STATUSES",
    "candidates_of",
    "load_candidate",
    "load_problem",
    "problem_names",
]

_PROBLEMS_DIR = "problems"
_CANDIDATES_DIR = "candidates"


@dataclass(frozen=True)
class SampleCase:
    """One candidate from the corpus, the problem it answers, and the status it must get."""

    problem: str  # file stem in problems/
    candidate: str  # file stem in candidates/
    expected_status: str  # one of eval_server.schema STATUS_* values
    what: str  # one-line description shown in tables
    backend: str = "triton"  # options.backend to evaluate it with (eval_server.schema.BACKENDS)


SAMPLE_CASES: tuple[SampleCase, ...] = (
    # relu
    SampleCase("relu", "relu__correct", STATUS_OK, "elementwise ReLU kernel"),
    SampleCase("relu", "relu__wrong_math", STATUS_INCORRECT, "kernel computes max(x, 0) * 0.5"),
    SampleCase("relu", "relu__syntax_error", STATUS_COMPILE_ERROR, "missing colon: SyntaxError"),
    SampleCase("relu", "relu__no_modelnew", STATUS_COMPILE_ERROR, "class is not named ModelNew"),
    SampleCase("relu", "relu__runtime_error", STATUS_RUNTIME_ERROR, "forward raises TypeError, no launch"),
    SampleCase("relu", "relu__not_launched", STATUS_REJECTED, "kernel defined, forward calls torch.relu"),
    SampleCase("relu", "relu__try_fallback", STATUS_REJECTED, "try/except falls back to torch.relu"),
    SampleCase("relu", "relu__copies_reference", STATUS_REJECTED, "ModelNew subclasses a copied Model"),
    SampleCase("relu", "relu__infinite_loop", STATUS_TIMEOUT, "forward spins forever"),
    SampleCase("relu", "relu__segfault", STATUS_CRASHED, "forward segfaults (native NULL read)"),
    SampleCase("relu", "relu__os_exit", STATUS_CRASHED, "forward calls os._exit(3)"),
    SampleCase(
        "relu", "relu__method_fallback", STATUS_REJECTED, "copy kernel launched, Tensor.clamp does the math"
    ),
    SampleCase(
        "relu", "relu__kernel_unused", STATUS_REJECTED, "kernel defined, never launched; Tensor.clamp"
    ),
    SampleCase("relu", "relu__modifies_input", STATUS_REJECTED, "writes the result into its input"),
    SampleCase("relu", "relu__monkey_patch", STATUS_REJECTED, "wrong math, rebinds torch.isclose/allclose"),
    # softmax
    SampleCase("softmax", "softmax__correct", STATUS_OK, "row-wise softmax, one program per row"),
    SampleCase("softmax", "softmax__wrong_shape", STATUS_INCORRECT, "drops the last column"),
    # sum_dim
    SampleCase("sum_dim", "sum_dim__correct", STATUS_OK, "tiled sum over one dim, keepdim"),
    # matmul
    SampleCase("matmul", "matmul__correct", STATUS_OK, "tiled GEMM with tl.dot"),
    SampleCase("matmul", "matmul__torch_matmul", STATUS_REJECTED, "token copy kernel, math by torch.matmul"),
    # gemm_scale_leakyrelu
    SampleCase(
        "gemm_scale_leakyrelu",
        "gemm_scale_leakyrelu__correct",
        STATUS_OK,
        "fused linear + scale + LeakyReLU kernel",
    ),
)


# Backend "cuda" (KernelBench's CUDA format, load_inline): kept apart from SAMPLE_CASES because they
# need a GPU worker to be `ok` (a CPU worker answers `unsupported` after its compile check) and every
# consumer of SAMPLE_CASES sends Triton requests.
CUDA_SAMPLE_CASES: tuple[SampleCase, ...] = (
    SampleCase("relu", "relu__cuda_correct", STATUS_OK, "elementwise ReLU __global__ kernel", "cuda"),
    SampleCase(
        "relu", "relu__cuda_compile_error", STATUS_COMPILE_ERROR, "nvcc: undeclared identifier", "cuda"
    ),
)


def _folder(name: str) -> Traversable:
    return resources.files(__name__) / name


def _stems(folder: str) -> list[str]:
    return sorted(
        entry.name[: -len(".py")]
        for entry in _folder(folder).iterdir()
        if entry.is_file() and entry.name.endswith(".py") and not entry.name.startswith("_")
    )


def _read(folder: str, kind: str, name: str) -> str:
    known = _stems(folder)
    if name not in known:
        raise KeyError(f"unknown sample {kind} {name!r}; known {kind}s: {', '.join(known)}")
    return (_folder(folder) / f"{name}.py").read_text(encoding="utf-8")


def problem_names() -> list[str]:
    """Stems of the bundled problem files, sorted."""
    return _stems(_PROBLEMS_DIR)


def candidate_names() -> list[str]:
    """Stems of the bundled candidate files, sorted."""
    return _stems(_CANDIDATES_DIR)


def load_problem(name: str) -> str:
    """Source text of problems/<name>.py; KeyError naming the known problems if there is none."""
    return _read(_PROBLEMS_DIR, "problem", name)


def load_candidate(name: str) -> str:
    """Source text of candidates/<name>.py; KeyError naming the known candidates if there is none."""
    return _read(_CANDIDATES_DIR, "candidate", name)


# Statuses of the bundled candidates that serve as wrong answers (the dry run's scripted engine,
# the warm-start SFT data): they compile but are incorrect, or fail to compile (not the reward-hack,
# timeout or crash cases, which test the evaluator rather than RL).
WRONG_STATUSES = ("incorrect", "compile_error")


def candidates_of(problem: str, statuses: tuple[str, ...], backend: str = "triton") -> list[str]:
    """The bundled candidates of `problem` (for `backend`) whose expected status is one of
    `statuses`, in corpus order (the dry run's wrong answers, the warm-start SFT data)."""
    return [
        c.candidate
        for c in SAMPLE_CASES
        if c.problem == problem and c.expected_status in statuses and c.backend == backend
    ]
