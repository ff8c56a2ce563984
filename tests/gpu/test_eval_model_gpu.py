"""tools/eval_model on a GPU eval server: speedups are measured, and fast_p / geomean speedup in the
report agree with the per-sample results. The policy is the labelled OpenAI chat TEST DOUBLE
(tests/openai_double.py) answering the bundled correct candidates (relu after a wrong first
attempt), so the outcome depends only on the evaluator.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_eval_model_gpu.py`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from eval_server.launch import first_gpu
from eval_server.samples import load_candidate, load_problem
from slime_ext.reports.results import load_results
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from tests.openai_double import OpenAIChatDouble
from tools import eval_model

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

F = "```"
SCRIPT = {
    "relu": ["relu__wrong_math", "relu__correct"],
    "softmax": ["softmax__correct"],
    "sum_dim": ["sum_dim__correct"],
    "matmul": ["matmul__correct"],
    "gemm_scale_leakyrelu": ["gemm_scale_leakyrelu__correct"],
}
LEVEL = {"relu": 1, "softmax": 1, "sum_dim": 1, "matmul": 2, "gemm_scale_leakyrelu": 2}


def responder(messages: list[dict[str, str]], body: dict[str, Any]) -> str:
    user = next(m["content"] for m in messages if m["role"] == "user")
    name = next(n for n in SCRIPT if load_problem(n).strip() in user)
    turn = sum(m["role"] == "assistant" for m in messages)
    answers = SCRIPT[name]
    return f"{F}python\n{load_candidate(answers[min(turn, len(answers) - 1)])}\n{F}"


def test_eval_model_reports_measured_speedups(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompt_records(
        prompts,
        [
            PromptRecord(f"kb_L{LEVEL[n]}_{n}", LEVEL[n], n, n, load_problem(n), split="holdout")
            for n in SCRIPT
        ],
    )
    double = OpenAIChatDouble(responder)
    url = double.start()
    out = tmp_path / "gpu"
    try:
        rc = eval_model.main(
            [
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--backend",
                "chat",
                "--url",
                url,
                "--model",
                "canned-gpu",
                "-k",
                "2",
                "--max-turns",
                "2",
                "--eval-devices",
                first_gpu(),
                "--eval-options",
                '{"correctness_trials": 2, "timing_trials": 30}',
                "--no-progress",
            ]  # fmt: skip
        )
    finally:
        double.stop()
    assert rc == 0
    records = load_results(out / "results.jsonl")
    assert len(records) == 10
    for r in records:
        correct = [t for t in r.turns if t.correct]
        assert correct, (r.instance_id, [(t.status, t.error) for t in r.turns])
        assert all(t.speedup is not None and t.speedup > 0 for t in correct)
    relu = [r for r in records if r.problem_id == "relu"]
    assert all([t.status for t in r.turns][0] == "incorrect" for r in relu)

    summary = json.loads((out / "summary.json").read_text())
    overall = summary["metrics"]["all"]["final"]
    best = [max(t.speedup for t in r.turns if t.correct) for r in records]
    assert overall["untimed_correct"] == 0 and overall["timed_correct"] == 10
    assert overall["geomean_speedup"] == pytest.approx(math.exp(sum(map(math.log, best)) / len(best)))
    # every problem has 2 samples, so the per-problem average equals the pooled share
    for p in summary["thresholds"]:
        assert overall["fast_p"][f"{p:g}"] == pytest.approx(
            sum(s > p for s in best) / len(best) if p > 0 else 1.0
        )
    print("\n" + (out / "report.md").read_text())
