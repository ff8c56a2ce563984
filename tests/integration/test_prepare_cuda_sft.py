"""tools.prepare_cuda_sft (= tools.prepare_kernelbook_sft --backend cuda) on a local copy of the
AI CUDA Engineer Archive in its layout (level_<N>.parquet): CUDA prompts, answers, exclusions,
report; verification against an eval server is covered in tests/unit/test_data_sakana.py
(request contents) and tests/gpu/test_prepare_cuda_sft_gpu.py (a real server on a GPU)."""

from __future__ import annotations

import json

import pytest

from bench.synthetic_data import RELU_MODULE, write_sakana_archive
from slime_ext.data.sft_format import load_sft_jsonl
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from slime_ext.rollout.prompts import default_prompt
from tools import prepare_cuda_sft, prepare_kernelbook_sft

pytestmark = pytest.mark.integration


@pytest.fixture
def archive(tmp_path):
    return write_sakana_archive(tmp_path / "AI-CUDA-Engineer-Archive")


def test_archive_to_cuda_sft_with_holdout_excluded(archive, tmp_path):
    holdout = tmp_path / "holdout.jsonl"
    record = PromptRecord("kb_L1_019", 1, "19_ReLU", "ReLU", RELU_MODULE, split="holdout")
    write_prompt_records(
        holdout, [PromptRecord(**{**vars(record), "metadata": {"kernelbench_problem_id": 19}})]
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kernel_rl:\n  episode:\n    backend: triton\n    prompt: {one_shot: true}\n")
    out = tmp_path / "sft.jsonl"
    argv = ["--input", str(archive), "--output", str(out), "--recipe", str(recipe), "--no-progress"]
    assert prepare_cuda_sft.main([*argv, "--exclude-problems", str(holdout)]) == 0
    (example,) = load_sft_jsonl(out)  # the ReLU task is holdout: only the Linear+scale kernel is left
    assert example.metadata["sakana"]["level"] == 2 and example.metadata["verified"] is False
    system, user, answer = example.messages
    assert system["content"] == default_prompt("cuda").system  # --backend cuda wins over the recipe's
    assert "load_inline" in user["content"] and "relu_module.relu_forward" in user["content"]  # one-shot
    assert "load_inline(" in answer["content"] and "class ModelNew" in answer["content"]
    report = json.loads((tmp_path / "sft.report.json").read_text())
    assert report["settings"]["backend"] == "cuda" and report["settings"]["per_task"] == 4
    assert report["rows"] == 7 and report["kept_single_turn"] == 1
    assert report["dropped"]["overlaps_eval_problem"] == 3 and report["dropped"]["answer_no_kernel"] == 1

    # per task: the fastest first; --per-task 0 keeps all
    assert prepare_cuda_sft.main([*argv, "--per-task", "0"]) == 0
    speedups = [e.metadata["sakana"].get("CUDA_Speedup_Native") for e in load_sft_jsonl(out)]
    assert speedups == [1.4, 1.1, None]


def test_refusals(archive, tmp_path, capsys):
    out = tmp_path / "sft.jsonl"
    base = ["--input", str(archive), "--output", str(out), "--no-progress"]
    assert prepare_cuda_sft.main([*base, "--backend", "triton"]) == 2
    assert "leave --backend out" in capsys.readouterr().err
    assert prepare_cuda_sft.main([*base, "--per-task", "-1"]) == 2
    # the archive read as KernelBook (the triton backend) is not KernelBook: named, nothing written
    assert prepare_kernelbook_sft.main(base) == 2
    assert "missing column(s)" in capsys.readouterr().err and not out.exists()
    # nothing survives: exit 1, the report says why
    assert prepare_cuda_sft.main([*base, "--min-archive-speedup", "10"]) == 1
    assert json.loads((tmp_path / "sft.report.json").read_text())["dropped"]["slow_in_archive"] == 4
    assert not out.exists()
