"""Prompt record format (slime_ext/rollout/problems.py): validation, round trip, atomic writes."""

from __future__ import annotations

import json

import pytest

from eval_server.schema import problem_hash
from krl_common.validation import ValidationError
from slime_ext.rollout.problems import (
    PromptRecord,
    load_prompt_records,
    parse_prompt_record,
    write_prompt_records,
)

pytestmark = pytest.mark.unit

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"


def _rec(**kw):
    base = {"instance_id": "kb_L1_1", "level": 1, "problem_id": "1_ReLU", "name": "ReLU", "reference": REF}
    base.update(kw)
    return base


def test_round_trip(tmp_path):
    recs = [
        parse_prompt_record(_rec()),
        parse_prompt_record(_rec(instance_id="kb_L2_2", level=2, split="holdout")),
    ]
    path = tmp_path / "prompts.jsonl"
    assert write_prompt_records(path, recs) == 2
    back = load_prompt_records(path)
    assert back == recs
    assert back[0].problem_hash == problem_hash(REF)
    assert back[1].split == "holdout"
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"level": 0}, "level"),
        ({"level": True}, "level"),
        ({"split": "test"}, "split"),
        ({"reference": "  "}, "reference"),
        ({"extra": 1}, "extra"),
        ({"problem_hash": "0" * 64}, "problem_hash"),
        ({"metadata": []}, "metadata"),
    ],
)
def test_rejects_bad_fields(change, message):
    with pytest.raises(ValidationError, match=message):
        parse_prompt_record(_rec(**change))


def test_missing_field_and_bad_line_name_the_place(tmp_path):
    data = _rec()
    del data["name"]
    with pytest.raises(ValidationError, match="name: missing"):
        parse_prompt_record(data)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_rec()) + "\n\n{not json\n")
    with pytest.raises(ValidationError, match=r"p\.jsonl:3"):
        load_prompt_records(path)


def test_duplicate_instance_ids_rejected(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_rec()) + "\n" + json.dumps(_rec()) + "\n")
    with pytest.raises(ValidationError, match="duplicate instance_id"):
        load_prompt_records(path)


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "p.jsonl"

    def gen():
        yield PromptRecord("a", 1, "a", "a", REF)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_prompt_records(path, gen())
    assert list(tmp_path.iterdir()) == []
