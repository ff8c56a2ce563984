"""The bench's CUDA candidates (bench/candidates/*__cuda.py) on a real GPU, through the eval server
with backend "cuda": each is `ok` on its problem at sizes that take the paths the full-size
KernelBench run (`bench/eval_throughput.py --backend cuda`) does not: a float4 tail and scalar
rows (ReLU, softmax), reducing the last dim (sum), tiles and a K loop cut short (GEMM).

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_bench_cuda_candidates_gpu.py -v`.
"""

from __future__ import annotations

import httpx
import pytest

from bench import corpus
from bench.eval_throughput import candidate_path

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

# (id, problem, sizes, (old, new) edit of the sized problem or None)
CASES = [
    ("relu-tail", "relu_large", {"BATCH": 7, "DIM": 1001}, None),  # 7007 elements: 3 past the float4s
    ("relu-vec", "relu_large", {"BATCH": 256, "DIM": 65536}, None),
    ("softmax-scalar-rows", "softmax_large", {"BATCH": 5, "DIM": 1001}, None),
    ("softmax-long-rows", "softmax_large", {"BATCH": 64, "DIM": 393216}, None),
    ("sum-dim1", "sum_dim_large", {"BATCH": 3, "DIM1": 1000, "DIM2": 77}, None),
    ("sum-last-dim", "sum_dim_large", {"BATCH": 3, "DIM1": 50, "DIM2": 999}, ("reduce_dim = 1", "reduce_dim = 2")),
    ("gemm-ragged", "gemm_scale_leakyrelu_large", {"BATCH": 100, "IN_FEATURES": 300, "OUT_FEATURES": 200}, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(two_worker_server: str) -> str:
    return two_worker_server


@pytest.mark.parametrize(("problem", "sizes", "edit"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cuda_candidate_is_ok(
    server: str, problem: str, sizes: dict[str, int], edit: tuple[str, str] | None
) -> None:
    reference = corpus.sized_problem(problem, sizes)
    if edit is not None:
        assert edit[0] in reference
        reference = reference.replace(*edit)
    body = {
        "reference": reference,
        "candidate": candidate_path(problem, "cuda").read_text(encoding="utf-8"),
        "options": {"backend": "cuda", "timeout_s": 300},
    }
    res = httpx.post(f"{server}/eval", json=body, timeout=900).json()
    assert res["status"] == "ok", res["feedback"]
    assert res["correct"] and res["kernel_launches"] >= 1 and res["speedup"] > 0, res
