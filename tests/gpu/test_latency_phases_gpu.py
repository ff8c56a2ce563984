"""Latency parts outside the evaluation phases on a real GPU (docs/EVAL_SERVER.md, result fields):
a request right after a syntax error (answered in milliseconds) waits for the next child's CUDA
preparation and says so in `phases.spare_wait`; after a full evaluation the next child is ready
(`spare_wait` ~0); `child_exit` (CUDA teardown included) is reported and part of `elapsed_s`.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_latency_phases_gpu.py -v -s`.
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


def _eval(url: str, candidate: str) -> dict:
    body = {"reference": samples.load_problem("relu"), "candidate": samples.load_candidate(candidate)}
    return httpx.post(f"{url}/eval", json=body, timeout=300).json()


def test_spare_wait_and_child_exit_on_gpu(tmp_path) -> None:
    with running_server(tmp_path, ["--devices", first_gpu(), "--workers-per-device", "1"]) as url:
        _eval(url, "relu__correct")  # compiles, fills the reference cache
        warm = _eval(url, "relu__correct")
        quick = _eval(url, "relu__syntax_error")
        after_quick = _eval(url, "relu__correct")
    print({name: r["phases"] for name, r in (("warm", warm), ("quick", quick), ("after_quick", after_quick))})
    assert warm["status"] == after_quick["status"] == "ok", (warm["feedback"], after_quick["feedback"])
    assert quick["status"] == "compile_error"
    # The full evaluation before `warm` outlasted the spare's preparation (~0.7 s on an H200).
    assert warm["phases"]["spare_wait"] < 0.05, warm["phases"]
    # `quick` took milliseconds: the next request found its child still preparing.
    assert after_quick["phases"]["spare_wait"] > 0.05, after_quick["phases"]
    for r in (warm, after_quick):
        assert 0 <= r["phases"]["child_exit"] < r["elapsed_s"], r["phases"]
        assert r["phases"]["queue_wait"] < 0.1, r["phases"]
