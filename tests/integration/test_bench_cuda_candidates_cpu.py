"""The bench's CUDA candidates (bench/candidates/*__cuda.py, used by `bench/eval_throughput.py
--backend cuda`) through a CPU eval server: each passes the static and source rules and its
sources compile with nvcc, so the evaluation ends `unsupported` with `compiled: true` (it cannot
run without a GPU), never `rejected` or `compile_error`. The problems are shrunk (the compile check
runs before the reference phase here, but a CPU test never builds KernelBench's multi-GB inputs).
Skips without nvcc. Two of the four (the softmax's reduction and the GEMM's tiles: the most
involved sources), compiled side by side by the two CPU workers (~100 s on 2 cores): all four
took 204 s of CI's time, and tests/gpu/test_bench_cuda_candidates_gpu.py builds and runs all four.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench import corpus
from bench.eval_throughput import KERNELBENCH_CASES, candidate_path
from tests.conftest import needs_nvcc

pytestmark = [pytest.mark.integration, needs_nvcc]

PROBLEMS = [problem for _, _, problem in KERNELBENCH_CASES if problem.startswith(("softmax", "gemm"))]


def _eval(url: str, problem: str) -> dict:
    body = {
        "reference": corpus.shrunk_problem(problem, 64),
        "candidate": candidate_path(problem, "cuda").read_text(encoding="utf-8"),
        "options": {"backend": "cuda"},
    }
    resp = httpx.post(f"{url}/eval", json=body, timeout=600.0)
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


def test_each_cuda_candidate_passes_the_rules_and_compiles(cpu_server: str) -> None:
    assert len(PROBLEMS) == 2, PROBLEMS
    with ThreadPoolExecutor(max_workers=2) as ex:
        results = dict(zip(PROBLEMS, ex.map(lambda p: _eval(cpu_server, p), PROBLEMS), strict=True))
    for problem, res in results.items():
        assert res["status"] == "unsupported", (problem, res["feedback"])
        assert res["compiled"] and res["checks"] == [], (problem, res["checks"])
        assert res["phases"]["compile"] > 0 and "reference" not in res["phases"], res["phases"]
