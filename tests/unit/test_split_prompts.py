"""tools/split_prompts.py: the records of one split, unchanged and in order; clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.rollout.problems import PromptRecord, load_prompt_records, write_prompt_records
from tools import split_prompts

pytestmark = pytest.mark.unit


def _records() -> list[PromptRecord]:
    return [
        PromptRecord("a", 1, "1_a", "a", "class Model: pass\n", split="train", metadata={"k": 1}),
        PromptRecord("b", 2, "2_b", "b", "class Model: x = 1\n", split="holdout"),
        PromptRecord("c", 1, "1_c", "c", "class Model: y = 2\n", split="train"),
    ]


def test_writes_the_records_of_one_split(tmp_path: Path, capsys) -> None:
    src = tmp_path / "all.jsonl"
    write_prompt_records(src, _records())
    assert split_prompts.main([str(src), str(tmp_path / "train.jsonl")]) == 0
    assert load_prompt_records(tmp_path / "train.jsonl") == [_records()[0], _records()[2]]
    assert "2 train record(s)" in capsys.readouterr().out
    assert split_prompts.main([str(src), str(tmp_path / "h.jsonl"), "--split", "holdout"]) == 0
    assert [r.instance_id for r in load_prompt_records(tmp_path / "h.jsonl")] == ["b"]


def test_missing_or_invalid_input_exit_2_empty_split_exit_1(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out.jsonl"
    assert split_prompts.main([str(tmp_path / "none.jsonl"), str(out)]) == 2
    assert "prompt data not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    assert split_prompts.main([str(bad), str(out)]) == 2
    assert "missing required field" in capsys.readouterr().err
    holdout = tmp_path / "holdout.jsonl"
    write_prompt_records(holdout, [_records()[1]])
    assert split_prompts.main([str(holdout), str(out)]) == 1
    assert "has no train record" in capsys.readouterr().err
    assert not out.exists()
