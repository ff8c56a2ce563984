"""With two workers on one GPU each evaluation may allocate its share of the GPU's memory
(Hardening.gpu_memory_fraction): a candidate that needs more runs out of it whatever the other
worker does, and is then run again alone on the GPU (uncapped, as with one worker per GPU), where
it runs; one that needs more than the GPU fails either way, with the out-of-memory error.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_memory_share_gpu.py -v`.
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


def _greedy_candidate(part: float = 0.6) -> str:
    """relu__correct that also allocates `part` of the GPU's memory in forward."""
    scratch = int(torch.cuda.get_device_properties(0).total_memory * part)
    source = samples.load_candidate("relu__correct")
    line = "        x = x.contiguous()\n"
    assert line in source
    return source.replace(
        line, f"        scratch = torch.empty({scratch}, dtype=torch.uint8, device=x.device)\n" + line
    )


def _eval(url: str, candidate: str) -> dict:
    body = {"reference": samples.load_problem("relu"), "candidate": candidate, "options": {"timing": False}}
    resp = httpx.post(f"{url}/eval", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_candidate_over_its_share_runs_alone(tmp_path) -> None:
    greedy = _greedy_candidate()
    args = ["--devices", first_gpu(), "--ref-cache", str(tmp_path / "ref.sqlite")]
    with running_server(tmp_path / "two", [*args, "--workers-per-device", "2"]) as url:
        shared = _eval(url, greedy)
        too_big = _eval(url, _greedy_candidate(1.2))
    assert shared["status"] == "ok", shared["feedback"]
    assert shared["phases"]["out_of_share_attempt"] > 0  # its first attempt ran out of the share
    assert too_big["status"] == "runtime_error" and "OutOfMemoryError" in too_big["feedback"]
    with running_server(tmp_path / "one", [*args, "--workers-per-device", "1"]) as url:
        alone = _eval(url, greedy)
    assert alone["status"] == "ok", alone["feedback"]
