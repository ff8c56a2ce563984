"""Loading KernelBench problems from a checkout tree and from HF-style dataset files."""

from __future__ import annotations

import json

import pytest

from bench.synthetic_data import KB_LEVELS, kb_source, write_kernelbench_hf, write_kernelbench_tree
from krl_common.validation import ValidationError
from slime_ext.data.kernelbench import check_problem_source, load_kernelbench, to_prompt_record
from slime_ext.rollout.problems import parse_prompt_record

pytestmark = pytest.mark.unit

N_PROBLEMS = sum(len(v) for v in KB_LEVELS.values())


def test_checkout_tree(tmp_path):
    problems = load_kernelbench(write_kernelbench_tree(tmp_path))
    assert len(problems) == N_PROBLEMS
    assert [p.level for p in problems] == sorted(p.level for p in problems)
    relu = next(p for p in problems if p.level == 1 and p.number == 19)
    assert (relu.name, relu.problem_id, relu.instance_id) == ("ReLU", "19_ReLU", "kb_L1_019")
    assert relu.origin == "KernelBench/level1/19_ReLU.py"
    assert "torch.relu(x)" in relu.source
    # the KernelBench/ folder itself works as the input too
    assert len(load_kernelbench(tmp_path / "KernelBench")) == N_PROBLEMS


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_hf_files_match_tree(tmp_path, fmt):
    tree = load_kernelbench(write_kernelbench_tree(tmp_path / "tree"))
    hf = load_kernelbench(write_kernelbench_hf(tmp_path / "hf", fmt))
    assert [(p.instance_id, p.problem_id, p.source) for p in hf] == [
        (p.instance_id, p.problem_id, p.source) for p in tree
    ]
    one = load_kernelbench(tmp_path / "hf" / "data" / f"level_2-00000-of-00001.{fmt}")
    assert {p.level for p in one} == {2} and len(one) == len(KB_LEVELS[2])


def test_level_filter(tmp_path):
    write_kernelbench_tree(tmp_path)
    assert {p.level for p in load_kernelbench(tmp_path, [1, 3])} == {1, 3}
    with pytest.raises(ValidationError, match=r"no problems for level\(s\) \[4\]"):
        load_kernelbench(tmp_path, [1, 4])


def test_bad_problem_named(tmp_path):
    write_kernelbench_tree(tmp_path)
    bad = tmp_path / "KernelBench" / "level2" / "9_Broken.py"
    bad.write_text("import torch\nclass Model(:\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"9_Broken.py: not valid Python \(line 2"):
        load_kernelbench(tmp_path)
    bad.write_text("import torch\ndef get_inputs():\n    return []\n", encoding="utf-8")
    with pytest.raises(
        ValidationError, match="9_Broken.py: not a KernelBench problem, no top-level Model, get_init"
    ):
        load_kernelbench(tmp_path)
    bad.unlink()
    (tmp_path / "KernelBench" / "level2" / "notes.py").write_text("x = 1\n")
    with pytest.raises(ValidationError, match=r"notes.py: file name is not <number>_<Name>.py"):
        load_kernelbench(tmp_path)


def test_bad_tables(tmp_path):
    path = tmp_path / "kb.jsonl"
    path.write_text(json.dumps({"code": kb_source("1_X", "x"), "level": 1, "name": "1_X.py"}) + "\n")
    with pytest.raises(ValidationError, match=r"kb.jsonl#row=0: missing column\(s\) \['problem_id'\]"):
        load_kernelbench(path)
    path.write_text(
        json.dumps({"code": kb_source("1_X", "x"), "level": "one", "name": "1_X.py", "problem_id": 1})
    )
    with pytest.raises(ValidationError, match="column 'level' must be an integer"):
        load_kernelbench(path)
    row = {"code": kb_source("1_X", "x"), "level": 1, "name": "1_X.py", "problem_id": 1}
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValidationError, match="duplicate KernelBench problem level 1 number 1"):
        load_kernelbench(path)
    path.write_text("{not json\n")
    with pytest.raises(ValidationError, match=r"kb.jsonl:1: not valid JSON"):
        load_kernelbench(path)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValidationError, match="unsupported file type '.csv'"):
        load_kernelbench(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        load_kernelbench(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValidationError, match="no KernelBench problems found"):
        load_kernelbench(empty)


def test_prompt_record_round_trip(tmp_path):
    problem = load_kernelbench(write_kernelbench_tree(tmp_path), [1])[0]
    record = to_prompt_record(problem, "holdout")
    again = parse_prompt_record(json.loads(json.dumps(record.to_json())))
    assert again == record
    assert record.split == "holdout" and record.level == 1
    assert record.metadata["kernelbench_problem_id"] == problem.number
    assert record.metadata["source"] == "kernelbench"


def test_check_problem_source_accepts_real_layout():
    check_problem_source(kb_source("19_ReLU", "torch.relu(x)"), "relu")


def test_json_array_and_json_lines(tmp_path):
    from bench.synthetic_data import kernelbench_rows

    rows = kernelbench_rows()
    array = tmp_path / "kb_array.json"
    array.write_text(json.dumps(rows))
    lines = tmp_path / "kb_lines.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [p.instance_id for p in load_kernelbench(array)] == [
        p.instance_id for p in load_kernelbench(lines)
    ]
    assert len(load_kernelbench(array)) == N_PROBLEMS
    array.write_text("[1, 2]")
    with pytest.raises(ValidationError, match=r"kb_array.json\[0\]: expected a JSON object"):
        load_kernelbench(array)
