"""KernelBench-sized problems with fast Triton candidates, for throughput and timing-noise benchmarks.

`problems/<name>.py` are reference problems in KernelBench format (`class Model`, `get_inputs()`,
`get_init_inputs()`, fp32 inputs from plain `torch.randn` without a device argument: the evaluator
sets the default device). Their shapes are the large ones KernelBench uses (a 6.4 GB ReLU, an
8192 x 8192 Linear on a batch of 1024, ...), so they only make sense on a GPU.
`candidates/<problem>__triton.py` define `ModelNew`: a correct, reasonably tuned Triton solution
with all math inside `@triton.jit` kernels.
`candidates/<problem>__cuda.py` (relu, softmax, sum_dim and gemm_scale_leakyrelu) solve the same
problems in KernelBench's CUDA format (`bench/eval_throughput.py --backend cuda`).

Size convention: every size of a problem is a module-level ALL_CAPS integer constant on a line of
its own (`BATCH = 4096`). Values that are not sizes (a reduce dim, a multiplier) are lower case
and are never touched. `shrunk_problem(name, factor)` divides every size constant so tests can
run the same problem, at a toy size, in the Triton interpreter; `sized_problem(name, sizes)` sets
them to given values (the timing-noise bench's size ladder). The candidates mask every tile,
so any shrunk size is valid (no multiple-of-16 requirement).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BENCH_CASES",
    "BenchCase",
    "load_candidate",
    "load_problem",
    "shrunk_problem",
    "size_constants",
    "sized_problem",
]

_HERE = Path(__file__).resolve().parent
_PROBLEMS_DIR = _HERE / "problems"
_CANDIDATES_DIR = _HERE / "candidates"

# `NAME = 123` alone on a line (an optional trailing comment is kept).
_SIZE_LINE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) = (?P<value>\d+)(?P<tail>[ \t]*(?:#.*)?)$", re.MULTILINE)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark problem and its Triton candidate."""

    problem: str  # stem in bench/problems
    candidate: str  # stem in bench/candidates
    level: int  # 1 or 2 (KernelBench-style level)
    kernel_us_h200: float  # rough expected candidate kernel time on an H200, for documentation


# Expected times: memory-bound kernels at ~4.2 TB/s of the H200's 4.8 TB/s; the GEMM at ~300
# TFLOP/s of tf32 tensor-core throughput. Estimates, not measurements (see docs/BENCHMARKS.md).
BENCH_CASES: tuple[BenchCase, ...] = (
    # 6.4 GB read + 6.4 GB written.
    BenchCase("relu_large", "relu_large__triton", 1, 3100.0),
    # 1.07 GB read twice, written once.
    BenchCase("softmax_large", "softmax_large__triton", 1, 850.0),
    # 8.6 GB read, 2 MB written.
    BenchCase("sum_dim_large", "sum_dim_large__triton", 1, 2100.0),
    # 137 GFLOP (2 * 1024 * 8192 * 8192) in tf32.
    BenchCase("gemm_scale_leakyrelu_large", "gemm_scale_leakyrelu_large__triton", 2, 500.0),
    # 134 MB read + 134 MB written.
    BenchCase("layernorm_large", "layernorm_large__triton", 1, 80.0),
    # 8 MB read + 8 MB written: launch overhead dominates.
    BenchCase("small_elementwise", "small_elementwise__triton", 1, 8.0),
)


def _read(directory: Path, name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"not a file stem: {name!r}")
    return (directory / f"{name}.py").read_text(encoding="utf-8")


def load_problem(name: str) -> str:
    """Source text of bench/problems/<name>.py."""
    return _read(_PROBLEMS_DIR, name)


def load_candidate(name: str) -> str:
    """Source text of bench/candidates/<name>.py."""
    return _read(_CANDIDATES_DIR, name)


def size_constants(source: str) -> dict[str, int]:
    """The module-level ALL_CAPS integer constants of a problem source, in file order."""
    return {m["name"]: int(m["value"]) for m in _SIZE_LINE.finditer(source)}


def shrunk_problem(name: str, factor: int) -> str:
    """Problem source with every size constant replaced by max(1, value // factor)."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor must be a positive integer, got {factor!r}")
    source = load_problem(name)
    return sized_problem(name, {k: max(1, v // factor) for k, v in size_constants(source).items()})


def sized_problem(name: str, sizes: dict[str, int]) -> str:
    """Problem source with the named size constants set to `sizes` (others keep their value);
    ValueError for a name that is not one of the problem's size constants or a size below 1."""
    source = load_problem(name)
    known = size_constants(source)
    if not known:
        raise ValueError(f"problem {name!r} has no ALL_CAPS integer size constants")
    unknown = sorted(set(sizes) - set(known))
    if unknown:
        raise ValueError(f"problem {name!r} has no size constant(s) {unknown}; known: {sorted(known)}")
    bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
    if bad:
        raise ValueError(f"sizes must be positive integers, got {bad}")

    def resize(m: re.Match[str]) -> str:
        return f"{m['name']} = {sizes.get(m['name'], int(m['value']))}{m['tail']}"

    return _SIZE_LINE.sub(resize, source)
