"""Roles in the multi-turn episode (slime_ext/rollout/roles.py): which role a turn
plays, each role's wording from the recipe (defaults unchanged without it), the role recorded in
the rollout metrics and the evaluation reports."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eval_server.schema import EvalResult
from krl_common.validation import ValidationError
from slime_ext.reports.metrics import role_summary
from slime_ext.reports.results import SampleResult, TurnResult, parse_sample_result
from slime_ext.rollout.prompts import (
    PromptConfig,
    build_messages,
    feedback_text,
    no_code_feedback,
    refused_feedback,
)
from slime_ext.rollout.recipe import episode_config_from_dict
from slime_ext.rollout.roles import FIXER, OPTIMIZER, RolePrompt, role_after
from slime_ext.slime_plugins.metrics import kernel_metrics
from slime_ext.slime_plugins.samples import METADATA_KEY, turn_summary

pytestmark = pytest.mark.unit

WRONG = EvalResult(status="incorrect", compiled=True, feedback="Status: incorrect.")
SLOW = EvalResult(status="ok", compiled=True, correct=True, speedup=0.7, feedback="Status: ok (0.7x).")


def test_the_role_after_an_attempt() -> None:
    assert role_after(None) == FIXER and role_after(WRONG) == FIXER
    assert role_after(EvalResult(status="compile_error")) == FIXER
    assert role_after(SLOW) == OPTIMIZER


def test_default_wording_is_unchanged_and_roles_add_theirs() -> None:
    plain = PromptConfig()
    assert feedback_text(WRONG, plain) == f"Status: incorrect.\n\n{plain.fix_instruction}"
    assert feedback_text(SLOW, plain) == f"Status: ok (0.7x).\n\n{plain.faster_instruction}"
    assert no_code_feedback(plain)["content"] == plain.no_code_feedback
    assert refused_feedback("too long", plain)["content"].endswith(plain.fix_instruction)
    roles = PromptConfig(
        roles={
            "generator": RolePrompt(preamble="You are the generator.", instruction="Write the first kernel."),
            "fixer": RolePrompt(preamble="You are the fixer."),
            "optimizer": RolePrompt(preamble="You are the optimizer.", instruction="Beat 1.0x."),
        }
    )
    assert feedback_text(WRONG, roles) == f"You are the fixer.\n\nStatus: incorrect.\n\n{plain.fix_instruction}"
    assert feedback_text(SLOW, roles) == "You are the optimizer.\n\nStatus: ok (0.7x).\n\nBeat 1.0x."
    assert no_code_feedback(roles)["content"].startswith("You are the fixer.")
    first = build_messages("class Model: ...", roles)[-1]["content"]
    assert first.startswith("You are the generator.") and first.endswith("Write the first kernel.")
    assert build_messages("class Model: ...", plain) == build_messages("class Model: ...", PromptConfig(roles={}))
    with pytest.raises(ValueError, match="unknown role"):
        PromptConfig(roles={"critic": RolePrompt()})


def test_roles_from_the_recipe() -> None:
    cfg = episode_config_from_dict(
        {"backend": "cuda", "prompt": {"roles": {"optimizer": {"instruction": "Faster, please."}}}}
    )
    assert cfg.prompt.role("optimizer").instruction == "Faster, please."
    assert cfg.prompt.role("fixer") == RolePrompt()
    assert cfg.prompt.system == episode_config_from_dict({"backend": "cuda"}).prompt.system  # the backend's wording kept
    with pytest.raises(ValidationError, match=r"prompt.roles: unknown role\(s\) \['judge'\]"):
        episode_config_from_dict({"prompt": {"roles": {"judge": {}}}})
    with pytest.raises(ValidationError, match=r"prompt.roles.fixer: unknown field"):
        episode_config_from_dict({"prompt": {"roles": {"fixer": {"text": "x"}}}})


def _sample(turns: list[dict]) -> SimpleNamespace:
    meta = {"turn": None, "turns": turns, "status": "completed", "level": 1}
    return SimpleNamespace(metadata={METADATA_KEY: meta}, group_index=0, index=id(turns), reward=0.0)


def test_rollout_metrics_per_role() -> None:
    gen_wrong = turn_summary(WRONG.to_json(), 0.1, "generator")
    fix_slow = turn_summary(SLOW.to_json(), 0.3, "fixer")
    opt_fast = turn_summary({**SLOW.to_json(), "speedup": 1.5}, 1.0, "optimizer")
    m = kernel_metrics([_sample([gen_wrong, fix_slow, opt_fast]), _sample([turn_summary(SLOW.to_json(), 0.3, "generator")])])
    assert m["rollout/kernel/role/generator/n"] == 2 and m["rollout/kernel/role/generator/correct_rate"] == 0.5
    assert m["rollout/kernel/role/fixer/correct_rate"] == 1.0 and m["rollout/kernel/role/fixer/fast_1_rate"] == 0.0
    assert m["rollout/kernel/role/optimizer/speedup_correct_mean"] == 1.5
    assert not any("role/" in k for k in kernel_metrics([_sample([turn_summary(None, 0.0)])]))  # no roles recorded


def _turn(i: int, role: str | None, correct: bool, speedup: float | None) -> TurnResult:
    return TurnResult(turn=i, status="ok" if correct else "incorrect", compiled=True, correct=correct,
                      speedup=speedup, role=role)  # fmt: skip


def test_report_per_role_and_old_results_without_roles() -> None:
    common = {"instance_id": "a", "problem_id": "a", "level": 1, "name": "a", "split": "holdout",
              "problem_hash": "h", "model": "m", "config_id": "c", "status": "completed"}  # fmt: skip
    samples = [
        SampleResult(sample=0, turns=(_turn(0, "generator", False, None), _turn(1, "fixer", True, 2.0)), **common),
        SampleResult(sample=1, turns=(_turn(0, "generator", True, 0.5), _turn(1, "optimizer", True, 0.5)), **common),
    ]
    per_role = role_summary(samples)
    assert per_role["generator"]["attempts"] == 2 and per_role["generator"]["correct_rate"] == 0.5
    assert per_role["fixer"]["geomean_speedup"] == pytest.approx(2.0) and per_role["fixer"]["fast_1"] == 1.0
    assert per_role["optimizer"]["fast_1"] == 0.0
    line = samples[0].to_json()
    assert parse_sample_result(line).turns[1].role == "fixer"
    for t in line["turns"]:
        del t["role"]  # a result written before roles
    assert parse_sample_result(line).turns[1].role is None
    line["turns"][0]["role"] = "critic"
    with pytest.raises(ValidationError, match="role"):
        parse_sample_result(line)
    from slime_ext.reports.report import build_summary, render_markdown

    text = render_markdown(build_summary(samples, {"model": "m"}))
    assert "## Per role (every attempt made in that role)" in text
    assert "| all | fixer | 1 |" in text.replace("  ", " ")
