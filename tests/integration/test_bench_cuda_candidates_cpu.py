"""The bench's CUDA candidates (bench/candidates/*__cuda.py, used by `bench/eval_throughput.py
--backend cuda`) pass the evaluator's rules as the rules evolve: the Python source's static rules
for backend `cuda`, and the source rules the compile process applies to each load_inline call's
CUDA and C++ sources before any compiler runs (the candidate imported in that forked process, as
in an evaluation). The compiler is stubbed out as missing, so the process stops after the rules
and says why: compiling and running them is tests/gpu/test_bench_cuda_candidates_gpu.py's (and
nvcc's path on a CPU worker is tests/integration/test_eval_cuda_cpu.py's), which took this test
~105 s of CI's 2 cores for two of the four.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.eval_throughput import KERNELBENCH_CASES, candidate_path
from eval_server.checks.cuda_static import CUDA_RULES
from eval_server.checks.static import run_static_checks
from eval_server.pipeline import cuda_backend

pytestmark = pytest.mark.integration

PROBLEMS = [problem for _, _, problem in KERNELBENCH_CASES]
NO_COMPILER = "no CUDA compiler (stubbed out by this test)"


@pytest.mark.parametrize("problem", PROBLEMS)
def test_each_cuda_candidate_passes_the_static_and_source_rules(
    problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = candidate_path(problem, "cuda").read_text(encoding="utf-8")
    assert run_static_checks(ast.parse(source), CUDA_RULES) == []
    monkeypatch.setattr(cuda_backend, "toolchain_problem", lambda build: NO_COMPILER)
    report = cuda_backend.compile_candidate(source, tmp_path, tmp_path / "cache", 120.0, build=False)
    assert report.checks == [], [(c.id, c.message[:200]) for c in report.checks]
    assert report.calls == 1 and report.unsupported == NO_COMPILER, report
    assert report.error is None and report.import_error is None, report


def test_a_source_rule_would_fail_this_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same path refuses a candidate whose CUDA source breaks a rule (a vendor library here)."""
    source = candidate_path("relu_large", "cuda").read_text(encoding="utf-8")
    broken = source.replace("__global__", "#include <cublas_v2.h>\n__global__", 1)
    assert broken != source
    monkeypatch.setattr(cuda_backend, "toolchain_problem", lambda build: NO_COMPILER)
    report = cuda_backend.compile_candidate(broken, tmp_path, tmp_path / "cache", 120.0, build=False)
    assert [c.id for c in report.checks] == ["static.cuda_library"] and report.unsupported is None, report
