"""torch.compile as a second baseline on a GPU (options.baseline_compile): the compiled reference
is timed and cached per problem, the speedup against it reported beside the eager one; a reference
that does not compile is said so and the eager speedup stands in.

Run on the GPU machine: `python -m pytest -m gpu -q tests/gpu/test_compile_baseline_gpu.py -s`.
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

# compiles into a graph with other outputs: dynamo traces the branch it takes while compiling
# (a `raise` there would only break the graph: the frame falls back to eager and compiles "fine")
NOT_COMPILABLE = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        if torch.compiler.is_compiling():
            return torch.relu(x) * 2
        return torch.relu(x)
def get_inputs():
    return [torch.randn(4096, 1024)]
def get_init_inputs():
    return []
"""


def _eval(url: str, reference: str, candidate: str) -> dict:
    body = {"reference": reference, "candidate": candidate, "options": {"baseline_compile": True}}
    resp = httpx.post(f"{url}/eval", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_compiled_reference_is_timed_cached_and_reported(tmp_path) -> None:
    args = ["--devices", first_gpu(), "--ref-cache", str(tmp_path / "ref.sqlite")]
    with running_server(tmp_path / "srv", args) as url:
        first = _eval(url, samples.load_problem("matmul"), samples.load_candidate("matmul__correct"))
        second = _eval(url, samples.load_problem("matmul"), samples.load_candidate("matmul__correct"))
        relu = _eval(url, NOT_COMPILABLE, samples.load_candidate("relu__correct"))
    for r in (first, second):
        assert r["status"] == "ok", r["feedback"]
        assert r["speedup_vs_compile"] > 0 and r["compile_reference_timing"]["median_ms"] > 0
        assert "Against torch.compile" in r["feedback"]
        print(
            r["speedup"],
            r["speedup_vs_compile"],
            r["compile_baseline"],
            r["phases"].get("judge_compile_reference"),
        )
    assert first["compile_baseline"] == "measured" and second["compile_baseline"] == "cache"
    assert "judge_compile_reference" in first["phases"] and "judge_compile_reference" not in second["phases"]
    assert relu["status"] == "ok", relu["feedback"]
    assert relu["compile_baseline"].startswith("failed: the compiled reference's outputs differ"), relu
    assert relu["speedup_vs_compile"] == relu["speedup"]
