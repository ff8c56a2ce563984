"""Optimizer-role SFT data from real timings: `tools.prepare_optimizer_sft` against the
eval server on a GPU. Two pairs on a memory-bound ReLU large enough to time (8192 x 4096 fp32):
the slower kernel runs the same pass twice (twice the memory traffic), the faster runs it once, so
the pair is kept; a pair whose "faster" kernel is the slower one's twin is dropped (`not_faster`).

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_optimizer_pairs_gpu.py -s`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_server.launch import first_gpu, running_server

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8192, 4096)]


def get_init_inputs():
    return []
"""

KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask, other=0.0), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), 4096),)
        relu_kernel[grid](x, out, x.numel(), BLOCK=4096)
        return out
"""
# relu(relu(x)) == relu(x): correct, with twice the memory traffic
TWICE = KERNEL.replace(
    "        return out\n",
    "        relu_kernel[grid](out, out, out.numel(), BLOCK=4096)\n        return out\n",
)
assert TWICE != KERNEL


def test_pairs_are_kept_by_their_measured_speedups(tmp_path: Path) -> None:
    from tools import prepare_optimizer_sft

    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"key": "relu_large:twice_vs_once", "reference": REFERENCE, "slower": TWICE, "faster": KERNEL},
        {"key": "relu_large:twins", "reference": REFERENCE, "slower": TWICE, "faster": TWICE + "\n# twin\n"},
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "optimizer_sft.jsonl"
    with running_server(tmp_path / "eval", ["--devices", first_gpu()]) as url:
        rc = prepare_optimizer_sft.main(["--pairs", str(pairs), "--output", str(out), "--eval-url", url])
    assert rc == 0
    examples = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["metadata"]["key"] for e in examples] == ["relu_large:twice_vs_once"], examples
    ex = examples[0]
    assert ex["metadata"]["role"] == "optimizer"
    slower, faster = ex["metadata"]["speedups"]
    assert faster >= 1.05 * slower, ex["metadata"]
    assert ex["messages"][-1]["content"].count("relu_kernel[grid]") == 1  # the trained answer: one pass
    feedback = ex["messages"][-2]["content"]
    assert "Speedup:" in feedback, feedback
    print(json.dumps({k: ex["metadata"][k] for k in ("key", "speedups")}))
    print(feedback[:800])
