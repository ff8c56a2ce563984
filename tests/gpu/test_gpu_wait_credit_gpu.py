"""Two workers on one GPU: a candidate that hangs inside its shared hold of the GPU lock (its
forward launches its kernel, then spins) keeps the other worker's judge from timing until its own
limit kills it. The honest evaluation sent right after it must still end `ok`: its wait for the
lock is credited (phase `gpu_wait_credit`), not counted against its limit.

Run on the GPU machine: `python -m pytest -m gpu -q tests/gpu/test_gpu_wait_credit_gpu.py -s`.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from eval_server import samples
from eval_server.launch import first_gpu, running_server

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

LIMIT_S = 30.0


def _eval(url: str, problem: str, candidate: str) -> dict:
    body = {
        "reference": samples.load_problem(problem),
        "candidate": samples.load_candidate(candidate),
        "options": {"timeout_s": LIMIT_S},
    }
    return httpx.post(f"{url}/eval", json=body, timeout=600).json()


def test_an_honest_neighbour_of_a_hang_is_not_timed_out(tmp_path) -> None:
    args = ["--devices", first_gpu(), "--workers-per-device", "2"]
    with running_server(tmp_path, args) as url:
        for problem, candidate in (("relu", "relu__correct"), ("softmax", "softmax__correct")):
            assert _eval(url, problem, candidate)["status"] == "ok"  # both workers warm
        with cf.ThreadPoolExecutor(max_workers=2) as pool:
            hang = pool.submit(_eval, url, "relu", "relu__infinite_loop")
            time.sleep(3.0)  # the hang holds its shared hold by now (a soft wait: the credit
            # decides the outcome whenever the honest one arrives within the hang's limit)
            honest = pool.submit(_eval, url, "softmax", "softmax__correct")
            hung, got = hang.result(), honest.result()
    print("hang", hung["status"], hung["elapsed_s"], "honest", got["status"], got["elapsed_s"], got["phases"])
    assert hung["status"] == "timeout"
    assert got["status"] == "ok", got["feedback"]
    # it waited for (most of) the rest of the hang's limit, none of it counted against its own
    assert got["phases"].get("gpu_wait_credit", 0) > LIMIT_S / 2, got["phases"]
