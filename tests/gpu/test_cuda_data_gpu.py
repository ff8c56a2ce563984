"""The `cuda` backend's model-side pieces on a real GPU: the CUDA one-shot example of the prompt
builds with load_inline and equals torch.relu; every answer tools.prepare_cuda_sft makes from the
archive fixture builds and equals its reference Model (same seed); and, once the eval server
accepts `options.backend: "cuda"`, the tool's verification keeps exactly those answers.

Run on the GPU machine (nvcc and ninja on PATH for load_inline):
    python -m pytest -m gpu tests/gpu/test_cuda_data_gpu.py -v
"""

from __future__ import annotations

import json

import pytest

from bench.synthetic_data import sakana_rows, write_sakana_archive
from eval_server.launch import first_gpu, running_server
from slime_ext.data.report import FilterReport
from slime_ext.data.sakana import select_archive_pairs
from slime_ext.data.sft_build import SFTBuildConfig
from slime_ext.rollout.prompts import CUDA_EXAMPLE
from tools.prepare_cuda_sft import main

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _run_module(source: str) -> dict:
    ns: dict = {"__name__": "candidate"}
    exec(compile(source, "<candidate>", "exec"), ns)
    return ns


def test_one_shot_example_builds_and_is_relu() -> None:
    model = _run_module(CUDA_EXAMPLE)["ModelNew"]().cuda()
    x = torch.randn(3, 1000, device="cuda")
    torch.testing.assert_close(model(x), torch.relu(x), rtol=0, atol=0)
    assert model(torch.empty(0, device="cuda")).numel() == 0


def test_archive_answers_build_and_match_their_reference() -> None:
    pairs = select_archive_pairs(sakana_rows(), SFTBuildConfig(), FilterReport(), per_task=None)
    assert len(pairs) == 3
    for pair in pairs:
        reference, answer = _run_module(pair.reference), _run_module(pair.answer)
        init = reference["get_init_inputs"]()
        torch.manual_seed(0)
        ref_model = reference["Model"](*init).cuda()
        torch.manual_seed(0)
        new_model = answer["ModelNew"](*init).cuda()
        inputs = [x.cuda() for x in reference["get_inputs"]()]
        torch.testing.assert_close(new_model(*inputs), ref_model(*inputs), rtol=1e-4, atol=1e-4, msg=pair.key)


def test_verification_through_the_eval_server(tmp_path) -> None:
    archive = write_sakana_archive(tmp_path / "archive")
    out = tmp_path / "sft.jsonl"
    with running_server(tmp_path / "srv", ["--devices", first_gpu()], startup_timeout_s=300.0) as url:
        rc = main(
            ["--input", str(archive), "--output", str(out), "--verify-url", url, "--per-task", "0"]
            + ["--correctness-trials", "2", "--eval-timeout", "600", "--no-progress"]
        )
    report = json.loads((tmp_path / "sft.report.json").read_text())
    refused = report["first_detail"].get("verify:refused", "")
    if "backend" in refused:
        pytest.skip(f"this eval server has no `cuda` backend yet: {refused}")
    assert rc == 0, report
    assert report["kept_single_turn"] == 3 and not any(k.startswith("verify:") for k in report["dropped"]), (
        report
    )
