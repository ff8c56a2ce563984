"""tools/sample_prompts.py: the prompt records of the bundled sample problems (the single-GPU
preset's PROMPT_DATA)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import samples
from slime_ext.rollout.problems import load_prompt_records
from tools import sample_prompts

pytestmark = pytest.mark.unit


def test_writes_every_bundled_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "prompts.jsonl"
    assert sample_prompts.main(["--out", str(out)]) == 0
    records = load_prompt_records(str(out))
    assert sorted(r.problem_id for r in records) == sorted(samples.problem_names())
    assert all(r.reference == samples.load_problem(r.problem_id) for r in records)
    assert f"{len(records)} sample prompt record(s)" in capsys.readouterr().out


def test_named_problems_and_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "two.jsonl"
    assert sample_prompts.main(["--out", str(out), "--problems", "relu", "softmax"]) == 0
    assert [r.problem_id for r in load_prompt_records(str(out))] == ["relu", "softmax"]
    bad = tmp_path / "bad.jsonl"
    assert sample_prompts.main(["--out", str(bad), "--problems", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err and not bad.exists()
