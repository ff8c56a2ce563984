"""slime_ext.rollout.prompts: first prompt and feedback messages."""

from __future__ import annotations

import ast
import re
from dataclasses import replace

import pytest

from eval_server.feedback import build_feedback
from eval_server.samples import load_problem
from eval_server.schema import EvalResult
from slime_ext.rollout.prompts import (
    DEFAULT_FIX_INSTRUCTION,
    DEFAULT_RESUBMIT_INSTRUCTION,
    PromptConfig,
    build_messages,
    default_prompt,
    feedback_message,
    feedback_text,
    no_code_feedback,
    refused_feedback,
)

pytestmark = pytest.mark.unit


def test_prompt_contains_reference_and_rules() -> None:
    ref = load_problem("relu")
    msgs = build_messages(ref)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert ref.strip() in user
    assert "class ModelNew(nn.Module)" in user
    assert "@triton.jit" in user
    assert "ONE fenced ```python" in user
    assert "relu_kernel" not in user  # no example by default


def test_one_shot_and_no_system() -> None:
    msgs = build_messages("class Model: pass", PromptConfig(one_shot=True, system=None))
    assert [m["role"] for m in msgs] == ["user"]
    content = msgs[0]["content"]
    assert "relu_kernel" in content
    assert content.index("relu_kernel") < content.index("class Model: pass")  # example before the task


def test_custom_templates() -> None:
    cfg = PromptConfig(system="S", instructions="DO IT", reference_header="REF:")
    msgs = build_messages("x = 1", cfg)
    assert msgs[0] == {"role": "system", "content": "S"}
    assert msgs[1]["content"] == "DO IT\n\nREF:\n\n```python\nx = 1\n```"


def test_feedback_fix_and_faster() -> None:
    bad = EvalResult(status="incorrect", compiled=True, feedback="Status: incorrect. max diff 3.2")
    msg = feedback_message(bad)
    assert msg["role"] == "user"
    assert msg["content"].startswith("Status: incorrect. max diff 3.2")
    assert "Fix the problem" in msg["content"] and "```python" in msg["content"]
    good = EvalResult(status="ok", compiled=True, correct=True, feedback="Correct. speedup 1.1x")
    assert "Make it faster" in feedback_message(good)["content"]


def test_feedback_without_text_and_trimmed() -> None:
    assert "Evaluation status: crashed" in feedback_message(EvalResult(status="crashed"))["content"]
    long = EvalResult(status="runtime_error", feedback="A" * 5000 + "END")
    content = feedback_message(long, PromptConfig(max_feedback_chars=100))["content"]
    assert "characters omitted" in content and "END" in content and len(content) < 400


def test_no_code_feedback() -> None:
    assert "```python" in no_code_feedback()["content"]


def test_refused_feedback() -> None:
    content = refused_feedback("candidate: too long")["content"]
    assert content.startswith("The evaluator refused the candidate: candidate: too long")
    assert "Fix the problem" in content


def test_cuda_wording_says_cuda_not_triton() -> None:
    config = replace(default_prompt("cuda"), one_shot=True)
    system, user = (m["content"] for m in build_messages(load_problem("relu"), config))
    assert "CUDA C++" in system and "Triton" not in system
    assert "load_inline" in user and "__global__" in user and "ONE fenced ```python" in user
    assert "triton" not in user.lower()
    example = ast.parse(config.example)  # the one-shot answer is a Python module ...
    names = {n.name for n in example.body if isinstance(n, ast.ClassDef)}
    calls = {n.func.id for n in ast.walk(example) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert names == {"ModelNew"} and "load_inline" in calls  # ... defining ModelNew, built with load_inline
    result = EvalResult(status="incorrect", compiled=True, feedback="max abs diff 3.0")
    for message in (
        feedback_message(result, config),
        no_code_feedback(config),
        refused_feedback("too long", config),
    ):
        assert "triton" not in message["content"].lower()


def test_default_prompt_rejects_unknown_backends() -> None:
    assert default_prompt() == PromptConfig()
    with pytest.raises(ValueError, match="unknown kernel backend 'hip'"):
        default_prompt("hip")


@pytest.mark.parametrize(
    "status, instruction",
    [
        ("compile_error", DEFAULT_FIX_INSTRUCTION),
        ("runtime_error", DEFAULT_FIX_INSTRUCTION),
        ("incorrect", DEFAULT_FIX_INSTRUCTION),
        ("timeout", DEFAULT_FIX_INSTRUCTION),
        ("crashed", DEFAULT_FIX_INSTRUCTION),
        ("reference_error", DEFAULT_RESUBMIT_INSTRUCTION),
        ("server_error", DEFAULT_RESUBMIT_INSTRUCTION),
    ],
)
def test_a_feedback_turn_carries_one_instruction_that_fits_its_status(status: str, instruction: str) -> None:
    """The evaluator's text describes; the user message instructs once (a 'not your fault' status
    is never asked for a fix)."""
    result = EvalResult(status=status, error={"type": "E", "message": "what happened", "traceback": ""})
    result.feedback = build_feedback(result)
    text = feedback_text(result)
    assert text.endswith(instruction)
    assert len(re.findall(r"\b(Fix|Return)\b", text)) == 1
    if "not your fault" in text:
        assert "Fix" not in text
