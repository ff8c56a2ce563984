"""Fixer examples of the warm-start data (tools/prepare_sample_sft.py --fixer) from a real eval
server on CPU: each bundled wrong candidate, the evaluator's own feedback on it handed to the
fixer, then the correct kernel; only the second answer is trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import samples
from slime_ext.data.sample_sft import WRONG_STATUSES, wrong_candidates
from slime_ext.data.sft_format import load_sft_jsonl
from slime_ext.rollout.candidate import extract_candidate
from slime_ext.rollout.prompts import build_messages
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe
from slime_ext.rollout.roles import FIXER
from slime_ext.sft.masking import tokenize_conversation
from tests.tiny_qwen3 import tiny_tokenizer
from tools import prepare_sample_sft

pytestmark = pytest.mark.integration


def test_fixer_examples_carry_the_evaluators_feedback_and_train_only_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sft.jsonl"
    assert prepare_sample_sft.main(["--output", str(out), "--eval-devices", "cpu"]) == 0
    printed = capsys.readouterr().out
    examples = load_sft_jsonl(out)
    fixes = [e for e in examples if e.metadata.get("turns") == 2]
    expected = wrong_candidates(["relu", "softmax"])
    assert sorted(e.metadata["first_candidate"] for e in fixes) == sorted(c for _, c in expected), printed
    assert len(examples) == 2 * len(expected) + len(expected) and "no fixer example" not in printed
    prompt = episode_config_from_recipe(load_recipe(prepare_sample_sft.DEFAULT_RECIPE)).prompt
    wording = prompt.role(FIXER)
    tok = tiny_tokenizer()
    for e in fixes:
        problem, first = e.metadata["problem"], e.metadata["first_candidate"]
        assert e.metadata["role"] == FIXER and e.metadata["first_status"] in WRONG_STATUSES
        head, wrong, feedback, fix = e.messages[:-3], e.messages[-3], e.messages[-2], e.messages[-1]
        assert head == build_messages(samples.load_problem(problem), prompt)  # the RL prompt
        assert extract_candidate(wrong["content"]).strip() == samples.load_candidate(first).strip()
        assert wrong["step_loss_mask"] == 0 and fix.get("step_loss_mask", 1) == 1
        assert extract_candidate(fix["content"]).strip() == samples.load_candidate(f"{problem}__correct").strip()
        # the evaluator's own words, handed to the fixer as the episode hands them
        assert feedback["role"] == "user" and e.metadata["first_status"] in feedback["content"].lower()
        assert (wording.instruction or prompt.fix_instruction) in feedback["content"]
        ids, mask = tokenize_conversation(tok, e.messages)
        trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert samples.load_candidate(f"{problem}__correct").strip().splitlines()[0] in trained
        assert extract_candidate(wrong["content"]).strip() not in trained


def test_no_fixer_writes_first_turns_only_and_a_dead_server_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    assert prepare_sample_sft.main(["--output", str(out), "--no-fixer"]) == 0
    assert all(e.metadata.get("turns", 1) == 1 for e in load_sft_jsonl(out))
    dead = tmp_path / "dead.jsonl"
    url = "http://127.0.0.1:9"  # discard port: nothing listens
    assert prepare_sample_sft.main(["--output", str(dead), "--eval-url", url, "--eval-timeout", "5"]) == 3
    assert not dead.exists()
