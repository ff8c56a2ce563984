"""`--runner-read-only` on a GPU: the candidate's process, in a user and mount namespace of its own
with every file system read-only but its worker's directory, still reaches the MPS daemon, maps the
judge's memory (CUDA IPC), compiles Triton kernels and builds CUDA extensions (nvcc); the
statuses and speedups are those of an unconfined server in the same run. Two workers per GPU so
the GPU lock files and the memory share are exercised too.

Run on the GPU machine: `python -m pytest -m gpu -q tests/gpu/test_runner_read_only_gpu.py -s`.
"""

from __future__ import annotations

import httpx
import pytest

from eval_server import samples
from eval_server.launch import first_gpu, running_server

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CASES = [  # (problem, candidate, backend, status)
    ("relu", "relu__correct", "triton", "ok"),
    ("softmax", "softmax__correct", "triton", "ok"),
    ("matmul", "matmul__correct", "triton", "ok"),
    ("relu", "relu__wrong_math", "triton", "incorrect"),
    ("relu", "relu__cuda_correct", "cuda", "ok"),
]


def _run(url: str) -> list[dict]:
    out = []
    for problem, candidate, backend, _ in CASES:
        body = {
            "reference": samples.load_problem(problem),
            "candidate": samples.load_candidate(candidate),
            "options": {"backend": backend},
        }
        out.append(httpx.post(f"{url}/eval", json=body, timeout=600).json())
    return out


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_read_only_runner_evaluates_as_an_unconfined_one(tmp_path, workers: str) -> None:
    args = ["--devices", first_gpu(), "--workers-per-device", workers]
    with running_server(tmp_path / "ro", [*args, "--runner-read-only"]) as url:
        assert httpx.get(f"{url}/health", timeout=30).json()["isolation"]["runner_read_only"] is True
        confined = _run(url)
    with running_server(tmp_path / "rw", args) as url:
        free = _run(url)
    for (_problem, candidate, _, status), ro, rw in zip(CASES, confined, free, strict=True):
        print(candidate, ro["status"], ro["speedup"], rw["status"], rw["speedup"])
        assert ro["status"] == status, ro["feedback"]
        assert rw["status"] == status, rw["feedback"]
        if status == "ok":  # single evaluations of small problems: within 15 % of each other
            assert ro["speedup"] == pytest.approx(rw["speedup"], rel=0.15), (candidate, ro["speedup"], rw["speedup"])
