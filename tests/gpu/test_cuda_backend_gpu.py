"""Backend "cuda" on a real GPU (torch + nvcc + ninja there): the CUDA samples end with their
statuses, a correct kernel is timed and counted by the profiler, a resubmission reuses its build,
and compilation does not hold the GPU lock while another evaluation times.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_cuda_backend_gpu.py -v`.
The exploit corpus's CUDA cases run in tests/gpu/test_exploits_gpu.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import uuid

import httpx
import pytest

from eval_server import samples

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _eval(url: str, candidate: str, backend: str = "cuda", **options) -> dict:
    body = {
        "reference": samples.load_problem("relu"),
        "candidate": candidate,
        "options": {"backend": backend, "timeout_s": 300, **options},
    }
    resp = httpx.post(f"{url}/eval", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _fresh(candidate: str) -> str:
    """The same candidate with sources no cache has seen (a comment in the CUDA string)."""
    return candidate.replace('relu_cuda_source = r"""', f'relu_cuda_source = r"""\n// {uuid.uuid4().hex}', 1)


@pytest.fixture(scope="module")
def server(two_worker_server: str) -> str:
    return two_worker_server


@pytest.mark.parametrize("case", samples.CUDA_SAMPLE_CASES, ids=lambda c: c.candidate)
def test_cuda_samples_get_their_status(server: str, case: samples.SampleCase) -> None:
    res = _eval(server, samples.load_candidate(case.candidate))
    assert res["status"] == case.expected_status, res["feedback"]
    assert res["device"].startswith("cuda:0")
    if case.expected_status == "ok":
        assert res["correct"] and res["kernel_launches"] >= 1, res
        assert res["speedup"] is not None and res["speedup"] > 0
        assert res["phases"]["compile"] > 0
    else:
        assert 'identifier "y" is undefined [line 4 of your cuda_sources]' in res["feedback"]


def test_a_resubmitted_kernel_is_not_rebuilt(server: str) -> None:
    candidate = _fresh(samples.load_candidate("relu__cuda_correct"))
    cold = _eval(server, candidate, timing=False)
    assert cold["status"] == "ok", cold["feedback"]
    warm = [_eval(server, candidate, timing=False) for _ in range(2)]  # both workers see it
    same_worker = [r for r in warm if r["worker"] == cold["worker"]]
    assert same_worker, "the pool never handed the first worker out again"
    for res in same_worker:
        assert res["status"] == "ok"
        assert res["phases"]["compile"] < min(3.0, cold["phases"]["compile"] / 3), (
            cold["phases"],
            res["phases"],
        )


def test_compilation_does_not_hold_the_gpu(server: str) -> None:
    """A cold CUDA build (tens of seconds) on one worker while the other worker evaluates a Triton
    candidate with timing: the Triton evaluation never waits for the GPU lock meanwhile."""
    cuda = _fresh(samples.load_candidate("relu__cuda_correct"))
    with cf.ThreadPoolExecutor(2) as ex:
        building = ex.submit(_eval, server, cuda)
        triton = [_eval(server, samples.load_candidate("relu__correct"), backend="triton") for _ in range(2)]
        built = building.result()
    assert built["status"] == "ok" and built["phases"]["compile"] > 5.0, built["phases"]
    for res in triton:
        assert res["status"] == "ok", res["feedback"]
        assert res["phases"].get("gpu_wait", 0.0) < 2.0, (res["phases"], built["phases"])
