"""tools/prepare_kernelbook_sft against the eval server on a real GPU, with KernelBook-shaped
answers that allocate on CUDA under Inductor's device guard (as real KernelBook rows do).

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_prepare_kernelbook_sft_gpu.py`.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.synthetic_data import kernelbook_rows
from eval_server.launch import first_gpu, running_server
from eval_server.schema import EvalOptions
from slime_ext.clients.eval_client import EvalClient
from slime_ext.data.kernelbook import parse_kernelbook_row, to_reference
from slime_ext.data.sft_format import load_sft_jsonl
from tools.prepare_kernelbook_sft import main

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_cuda_answers_verify_and_raw_inductor_code_does_not(tmp_path):
    rows = kernelbook_rows("cuda")
    path = tmp_path / "kb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sft.jsonl"
    with running_server(tmp_path / "srv", ["--devices", first_gpu()], startup_timeout_s=300.0) as url:
        rc = main(
            ["--input", str(path), "--output", str(out), "--verify-url", url, "--mutate"]
            + ["--max-reference-chars", "4000", "--no-progress", "--correctness-trials", "3"]
        )
        # The same answer before the rewrite (only the class renamed): the evaluator refuses it.
        raw = rows[0]["triton_code"].replace("ScaledReluNew", "ModelNew")
        reference = to_reference(parse_kernelbook_row(rows[0], 0))

        async def evaluate_raw():
            async with EvalClient(url, timeout_s=300) as client:
                return await client.evaluate_source(reference, raw, options=EvalOptions(correctness_trials=1))

        raw_result = asyncio.run(evaluate_raw())
    assert rc == 0
    examples = load_sft_jsonl(out)
    summary = sorted((e.metadata["key"], e.turns, e.metadata.get("first_attempt_status")) for e in examples)
    assert summary == [("1", 1, None), ("1", 2, "incorrect"), ("2", 1, None), ("2", 2, "incorrect")]
    for e in examples:
        assert (
            "empty_strided_cuda" in e.messages[-1]["content"] and "torch._C" not in e.messages[-1]["content"]
        )
    report = json.loads((tmp_path / "sft.report.json").read_text())
    assert report["dropped"]["verify:incorrect"] == 1 and report["kept_single_turn"] == 2
    assert raw_result.status in ("rejected", "compile_error"), raw_result.feedback
