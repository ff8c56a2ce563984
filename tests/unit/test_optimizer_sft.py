"""Optimizer-role SFT examples (slime_ext/data/optimizer_sft.py): which pairs make one, and the
example's layout (the slower kernel as context, its feedback handed to the optimizer in the
recipe's wording, the faster kernel trained)."""

from __future__ import annotations

import pytest

from eval_server.samples import load_candidate, load_problem
from eval_server.schema import EvalResult
from krl_common.validation import ValidationError
from slime_ext.data.optimizer_sft import KernelPair, optimizer_example, pair_verdict, parse_kernel_pair
from slime_ext.rollout.prompts import PromptConfig
from slime_ext.rollout.roles import RolePrompt

pytestmark = pytest.mark.unit


def _ok(speedup: float | None) -> EvalResult:
    return EvalResult(status="ok", compiled=True, correct=True, speedup=speedup, feedback=f"Status: ok ({speedup}x).")


def test_which_pairs_are_kept() -> None:
    assert pair_verdict(_ok(0.8), _ok(1.2), 0.05) is None
    assert pair_verdict(_ok(1.0), _ok(1.04), 0.05) == "not_faster"
    assert pair_verdict(_ok(1.2), _ok(0.8), 0.05) == "not_faster"
    assert pair_verdict(_ok(None), _ok(None), 0.05) == "untimed"  # a CPU evaluator cannot order them
    assert pair_verdict(EvalResult(status="incorrect"), _ok(2.0), 0.05) == "not_both_correct"


def test_the_example() -> None:
    relu = load_problem("relu")
    pair = KernelPair("relu-1", relu, "SLOW-KERNEL", load_candidate("relu__correct"))
    prompt = PromptConfig(roles={"optimizer": RolePrompt(preamble="You are the optimizer.")})
    ex = optimizer_example(pair, _ok(0.8), _ok(1.3), prompt)
    layout = [(m["role"], m.get("step_loss_mask", 1)) for m in ex.messages]
    assert layout == [("system", 1), ("user", 1), ("assistant", 0), ("user", 1), ("assistant", 1)]
    assert "SLOW-KERNEL" in ex.messages[2]["content"]
    assert ex.messages[3]["content"].startswith("You are the optimizer.\n\nStatus: ok (0.8x).")
    assert ex.metadata["role"] == "optimizer" and ex.metadata["speedups"] == [0.8, 1.3]
    with pytest.raises(ValueError, match="not correct"):
        optimizer_example(pair, EvalResult(status="incorrect"), _ok(1.3), prompt)


def test_pairs_file_lines() -> None:
    assert parse_kernel_pair({"key": "k", "reference": "r", "slower": "s", "faster": "f"}).faster == "f"
    with pytest.raises(ValidationError, match="pair.faster: missing"):
        parse_kernel_pair({"key": "k", "reference": "r", "slower": "s"})
    with pytest.raises(ValidationError, match="unknown"):
        parse_kernel_pair({"key": "k", "reference": "r", "slower": "s", "faster": "f", "speedup": 2})
