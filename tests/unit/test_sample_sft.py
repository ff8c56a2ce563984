"""Warm-start SFT data from the bundled samples (slime_ext/data/sample_sft.py, tools/prepare_sample_sft.py):
each problem's RL prompt answered once correctly and once wrongly, in slime's SFT format."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import samples
from slime_ext.data.sample_sft import sample_sft_examples
from slime_ext.data.sft_format import load_sft_jsonl
from slime_ext.rollout.candidate import extract_candidate
from slime_ext.rollout.prompts import build_messages, default_prompt
from tools import prepare_sample_sft

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_each_problem_gets_correct_and_wrong_answers_to_its_rl_prompt() -> None:
    prompt = default_prompt()
    with pytest.raises(ValueError, match="sum_dim: no bundled wrong candidate"):
        sample_sft_examples(["relu", "sum_dim"], prompt)
    examples = sample_sft_examples(["relu", "sum_dim"], prompt, repeat=2, mutations=True)
    by_problem: dict[str, list] = {}
    for e in examples:
        by_problem.setdefault(e.metadata["problem"], []).append(e)
    assert set(by_problem) == {"relu", "sum_dim"}
    for name, group in by_problem.items():
        assert sum(e.metadata["correct"] for e in group) * 2 == len(group)  # half correct
        for e in group:
            assert e.messages[:-1] == build_messages(samples.load_problem(name), prompt)  # the RL prompt
            code = extract_candidate(e.messages[-1]["content"])  # what the RL extractor reads
            if e.metadata["correct"]:
                assert code.strip() == samples.load_candidate(f"{name}__correct").strip()
            else:
                assert code.strip() != samples.load_candidate(f"{name}__correct").strip()
    relu_wrong = {e.metadata["candidate"] for e in by_problem["relu"] if not e.metadata["correct"]}
    assert relu_wrong == set(samples.candidates_of("relu", ("incorrect", "compile_error")))
    assert all(e.metadata["status_verified"] for e in by_problem["relu"])
    # sum_dim has no bundled wrong candidate: a mutation of its kernel, said to be unverified
    sum_wrong = [e for e in by_problem["sum_dim"] if not e.metadata["correct"]]
    assert {e.metadata["candidate"] for e in sum_wrong} == {"sum_dim__mutation"}
    assert not any(e.metadata["status_verified"] for e in sum_wrong)
    assert len(by_problem["relu"]) == 2 * 2 * len(relu_wrong)  # repeat x (correct, wrong) per wrong


def test_cli_writes_slimes_sft_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sft.jsonl"
    assert prepare_sample_sft.main(["--output", str(out), "--no-fixer"]) == 0  # default: relu and softmax
    examples = load_sft_jsonl(out)
    assert len(examples) == 2 * (3 + 1) and "wrote 8 examples (4 correct, 4 wrong first answers, 0 two-turn fixes)" in capsys.readouterr().out
    assert prepare_sample_sft.main(["--output", str(out), "--problems", "nosuch", "--no-fixer"]) == 2
    assert prepare_sample_sft.main(["--output", str(out), "--repeat", "0", "--no-fixer"]) == 2


def test_cli_prompts_are_the_launchers_default_recipe_prompts(tmp_path: Path) -> None:
    """The warm start must see the RL run's prompts token for token: by default those of the
    launcher's RECIPE (configs/run/common.sh), whose prompt has the one-shot example (an SFT on
    prompts without it wrote no code at all once the RL run showed it the example)."""
    from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe

    common = (REPO / "configs" / "run" / "common.sh").read_text()
    assert "RECIPE:=${KRL_REPO_ROOT}/configs/recipe/kernelbench_multiturn.yaml" in common
    recipe = REPO / "configs" / "recipe" / "kernelbench_multiturn.yaml"
    assert recipe == prepare_sample_sft.DEFAULT_RECIPE
    rl_prompt = episode_config_from_recipe(load_recipe(recipe)).prompt
    assert rl_prompt.one_shot  # what made the difference on the GPU
    out = tmp_path / "sft.jsonl"
    assert prepare_sample_sft.main(["--output", str(out), "--no-fixer"]) == 0
    for e in load_sft_jsonl(out):
        assert e.messages[:-1] == build_messages(samples.load_problem(e.metadata["problem"]), rl_prompt)
        assert rl_prompt.example_header in e.messages[1]["content"]
