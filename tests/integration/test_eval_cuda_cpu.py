"""Backend "cuda" on a CPU eval server, over real HTTP: what a worker without a GPU can judge.

Static and source rules reject as on a GPU (the exploit corpus covers them); with nvcc installed
the candidate's sources are compile-checked, a compile error comes back with nvcc's message mapped
to the candidate's own lines, and a candidate that compiles ends `unsupported` (it cannot run
here); a resubmission hits the build cache. Tests that need nvcc skip without it.
"""

from __future__ import annotations

import httpx
import pytest

from eval_server import samples
from tests.conftest import needs_nvcc

pytestmark = pytest.mark.integration


def _eval(url: str, candidate: str, **options) -> dict:
    payload = {
        "reference": samples.load_problem("relu"),
        "candidate": samples.load_candidate(candidate),
        "options": {"backend": "cuda", **options},
    }
    resp = httpx.post(f"{url}/eval", json=payload, timeout=400.0)
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


def test_unknown_backend_is_a_400(cpu_server: str):
    payload = {"reference": "x", "candidate": "y", "options": {"backend": "rocm"}}
    resp = httpx.post(f"{cpu_server}/eval", json=payload, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"] == "options.backend: unknown backend 'rocm'; known: ['triton', 'cuda']"


def test_a_triton_candidate_sent_as_cuda_is_told_what_the_format_is(cpu_server: str):
    res = _eval(cpu_server, "relu__correct")
    assert res["status"] == "rejected", res["feedback"]
    assert [c["id"] for c in res["checks"]] == ["static.no_cuda_kernel"]
    assert "load_inline" in res["feedback"]


@needs_nvcc
def test_compile_error_feedback_is_nvccs_message_on_the_candidates_line(cpu_server: str):
    res = _eval(cpu_server, "relu__cuda_compile_error")
    assert res["status"] == "compile_error", res["feedback"]
    assert not res["compiled"] and res["error"]["type"] == "CudaCompileError"
    feedback = res["feedback"]
    assert 'cuda.cu(7): error: identifier "y" is undefined [line 4 of your cuda_sources]' in feedback
    assert "fmaxf(y[i], 0.0f)" in feedback and "site-packages" not in feedback
    assert res["phases"]["compile"] > 0 and "reference" not in res["phases"]


@needs_nvcc
def test_a_compiling_candidate_is_unsupported_here_and_cached(cpu_server: str):
    first = _eval(cpu_server, "relu__cuda_correct")
    assert first["status"] == "unsupported", first["feedback"]
    assert first["compiled"] and not first["correct"] and first["speedup"] is None
    assert "no GPU" in first["feedback"] and "not your fault" in first["feedback"]
    # Builds are cached per worker; the pool hands the worker that just finished out first.
    again = _eval(cpu_server, "relu__cuda_correct")
    assert again["status"] == "unsupported" and again["worker"] == first["worker"]
    assert again["phases"]["compile"] < 5.0 < first["phases"]["compile"], (first["phases"], again["phases"])
