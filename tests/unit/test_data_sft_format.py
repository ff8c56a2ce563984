"""The slime SFT `messages` format: structure rules, step_loss_mask, atomic jsonl round trip."""

from __future__ import annotations

import json

import pytest

from krl_common.validation import ValidationError
from slime_ext.data.sft_format import (
    SFTExample,
    assistant_message,
    load_sft_jsonl,
    parse_sft_example,
    validate_messages,
    write_sft_jsonl,
)

pytestmark = pytest.mark.unit

SYS = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}


def test_assistant_message_fences_code():
    m = assistant_message("\nx = 1\n")
    assert m == {"role": "assistant", "content": "```python\nx = 1\n```"}
    assert assistant_message("x", trained=False)["step_loss_mask"] == 0


def test_valid_shapes():
    validate_messages([SYS, USER, assistant_message("a")])
    validate_messages([USER, assistant_message("a", trained=False), USER, assistant_message("b")])


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "must not be empty"),
        ([USER], "must end with an assistant message"),
        ([SYS, SYS, USER, {"role": "assistant", "content": "a"}], r"\[1\].role: expected 'user'"),
        ([USER, USER], r"\[1\].role: expected 'assistant'"),
        ([USER, {"role": "assistant", "content": " "}], "content: must not be empty"),
        ([USER, {"role": "assistant", "content": 3}], "content: expected str"),
        ([USER, {"role": "assistant"}], "content: missing required field"),
        ([USER, {"role": "assistant", "content": "a", "name": "x"}], r"unknown field\(s\) \['name'\]"),
        (
            [USER, {"role": "assistant", "content": "a", "step_loss_mask": 2}],
            "step_loss_mask: expected 0 or 1",
        ),
        ([USER, assistant_message("a", trained=False)], "no trained assistant message"),
        ("text", "expected list"),
    ],
)
def test_invalid(messages, match):
    with pytest.raises(ValidationError, match=match):
        validate_messages(messages)


def test_round_trip_atomic(tmp_path):
    examples = [
        SFTExample([SYS, USER, assistant_message("a")], {"key": "1"}),
        SFTExample([USER, assistant_message("x", trained=False), USER, assistant_message("y")], {"key": "2"}),
    ]
    path = tmp_path / "sft.jsonl"
    assert write_sft_jsonl(path, examples) == 2
    assert load_sft_jsonl(path) == examples
    assert [e.turns for e in examples] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["sft.jsonl"]  # no temporary file left behind

    def broken():
        yield examples[0]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_sft_jsonl(path, broken())
    assert load_sft_jsonl(path) == examples and len(list(tmp_path.iterdir())) == 1


def test_load_errors_name_line(tmp_path):
    path = tmp_path / "sft.jsonl"
    good = json.dumps({"messages": [USER, assistant_message("a")]})
    path.write_text(good + "\n" + json.dumps({"messages": [USER]}) + "\n")
    with pytest.raises(ValidationError, match=r"sft.jsonl:2.messages: must end with an assistant"):
        load_sft_jsonl(path)
    path.write_text(good + "\n{oops\n")
    with pytest.raises(ValidationError, match=r"sft.jsonl:2: not valid JSON"):
        load_sft_jsonl(path)
    with pytest.raises(ValidationError, match=r"unknown field\(s\) \['extra'\]"):
        parse_sft_example({"messages": [USER, assistant_message("a")], "extra": 1})
