"""Where a forward's GPU time went, measured by CUPTI on a real GPU.

`result.kernel_time` (the candidate's own share of one profiled forward, the other activities)
and the reference's forward beside it (`reference_us`, `reference_top`, profiled once per problem
in the reference phase) have only been unit-tested on hand-made activity lists; this runs them
through the eval server on the device: a clean kernel spends most of its time in its own kernel,
the same kernel behind a needless clone and zero fill spends less and names the copy, and the
GEMM problem's reference names a matrix-multiply kernel as its bottleneck.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_kernel_time_gpu.py -s`.
"""

from __future__ import annotations

import json

import pytest

from eval_server import samples
from tests.gpu.test_eval_gpu import _eval as eval_sample

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CLEAN = samples.load_candidate("relu__correct")
# the same kernel behind copies and a fill the computation does not need (allowed: not compute)
WASTEFUL = CLEAN.replace(
    "        x = x.contiguous()\n        out = torch.empty_like(x)\n",
    "        x = x.clone()\n        out = torch.zeros_like(x)\n",
)
assert WASTEFUL != CLEAN
# names of the matrix-multiply kernels cuBLAS / cuBLASLt launch on Hopper and earlier
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "xmma", "matmul", "sm90", "sm80")


def _eval(url: str, problem: str, candidate: str) -> dict:
    res = eval_sample(url, problem, candidate)
    assert res["status"] == "ok", res["feedback"][:1500]
    print(problem, json.dumps(res["kernel_time"]))
    return res


def test_own_share_and_the_reference_beside_it(gpu_server: str) -> None:
    clean = _eval(gpu_server, "relu", CLEAN)
    kt = clean["kernel_time"]
    assert kt is not None, "a GPU evaluation is profiled"
    assert 0 < kt["own_us"] <= kt["total_us"]
    assert kt["own_share"] >= 0.8, kt  # one kernel, output allocated without a fill
    assert kt["reference_us"] and kt["reference_us"] > 0, kt
    assert kt["reference_top"] and all(t["us"] > 0 and t["name"] for t in kt["reference_top"]), kt
    assert "GPU time of one forward:" in clean["feedback"]
    assert "The reference's forward:" in clean["feedback"]

    wasteful = _eval(gpu_server, "relu", WASTEFUL)
    wt = wasteful["kernel_time"]
    assert wt is not None and wt["others"], wt
    assert wt["own_share"] < kt["own_share"], (wt, kt)
    assert wt["total_us"] > wt["own_us"]
    # the reference was profiled once for the problem: the second evaluation shows the same figures
    assert wt["reference_us"] == kt["reference_us"]


def test_the_gemm_reference_names_its_matmul_as_bottleneck(gpu_server: str) -> None:
    res = _eval(gpu_server, "gemm_scale_leakyrelu", samples.load_candidate("gemm_scale_leakyrelu__correct"))
    top = res["kernel_time"]["reference_top"]
    assert top, res["kernel_time"]
    assert any(part in str(top[0]["name"]).lower() for part in GEMM_NAMES), top
    assert top[0]["us"] >= 0.5 * res["kernel_time"]["reference_us"], res["kernel_time"]
