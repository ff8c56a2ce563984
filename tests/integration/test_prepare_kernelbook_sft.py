"""tools/prepare_kernelbook_sft against the REAL eval server (CPU, Triton interpreter): answers are
verified, failing first attempts get the server's real feedback as the second user turn."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.synthetic_data import kernelbook_rows, write_word_tokenizer
from eval_server.launch import free_port
from slime_ext.data.kernelbook import parse_kernelbook_row, to_answer, to_reference
from slime_ext.data.sft_build import token_counter
from slime_ext.data.sft_format import load_sft_jsonl
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from tools.prepare_kernelbook_sft import main

pytestmark = pytest.mark.integration

LIMITS = ["--max-reference-chars", "4000", "--no-progress"]


@pytest.fixture
def kb_parquet(tmp_path):
    path = tmp_path / "kernelbook.parquet"
    pq.write_table(pa.Table.from_pylist(kernelbook_rows()), path)
    return path


def test_verify_and_multi_turn(cpu_server, kb_parquet, tmp_path):
    attempts = tmp_path / "attempts.jsonl"
    attempts.write_text(
        "".join(
            json.dumps(a) + "\n"
            for a in [
                {"key": "2", "candidate": "import torch\nclass ModelNew(:\n", "source": "model-sample"},
                {"key": 1, "candidate": to_answer(parse_kernelbook_row(kernelbook_rows()[0], 0))},  # passes
                {"key": "7", "candidate": "x = 1"},  # row 7 fails verification
                {"key": "99", "candidate": "x = 1"},  # no such row
            ]
        )
    )
    out = tmp_path / "out" / "sft.jsonl"
    rc = main(
        ["--input", str(kb_parquet), "--output", str(out), "--verify-url", cpu_server, "--mutate"]
        + ["--attempts", str(attempts), "--correctness-trials", "2", *LIMITS]
    )
    assert rc == 0
    examples = load_sft_jsonl(out)
    summary = [(e.metadata["key"], e.turns, e.metadata.get("first_attempt_status")) for e in examples]
    # rows in order; each verified row's single-turn example, then its multi-turn ones
    assert summary[0] == ("1", 1, None) and summary[2][0] == "2"
    assert sorted(summary) == sorted(
        [
            ("1", 1, None),
            ("1", 2, "incorrect"),
            ("2", 1, None),
            ("2", 2, "compile_error"),
            ("2", 2, "incorrect"),
        ]
    )
    for e in examples:
        assert e.metadata["verified"] is True
        assert e.messages[-1]["role"] == "assistant" and "class ModelNew" in e.messages[-1]["content"]
    compile_error = next(e for e in examples if e.metadata.get("first_attempt_status") == "compile_error")
    assert compile_error.metadata["first_attempt_source"] == "model-sample"
    assert compile_error.messages[2] == {
        "role": "assistant",
        "content": "```python\nimport torch\nclass ModelNew(:\n```",
        "step_loss_mask": 0,
    }
    feedback = compile_error.messages[3]["content"]
    assert "SyntaxError" in feedback or "syntax" in feedback.lower()
    assert "Fix the problem" in feedback
    mutated = next(
        e for e in examples if e.metadata.get("first_attempt_source") == "mutation:flip_arithmetic"
    )
    assert "max abs diff" in mutated.messages[3]["content"]

    report = json.loads((tmp_path / "out" / "sft.report.json").read_text())
    assert report["rows"] == 10 and report["kept_single_turn"] == 2 and report["multi_turn"] == 3
    assert report["dropped"]["verify:incorrect"] == 1 and report["example_keys"]["verify:incorrect"] == ["7"]
    assert report["multi_turn_skipped"] == {"attempt_passed": 1, "no_verified_answer": 2}
    assert report["settings"]["eval_options"]["correctness_trials"] == 2


def test_min_speedup_needs_timing(cpu_server, kb_parquet, tmp_path):
    """The CPU server reports no timing, so no answer can prove a speedup: all are dropped."""
    out = tmp_path / "sft.jsonl"
    args = [
        "--input",
        str(kb_parquet),
        "--output",
        str(out),
        "--verify-url",
        cpu_server,
        "--min-speedup",
        "1.0",
    ]
    assert main([*args, "--correctness-trials", "1", *LIMITS]) == 1
    report = json.loads((tmp_path / "sft.report.json").read_text())
    assert report["dropped"]["verify:no_timing"] == 2 and report["dropped"]["verify:incorrect"] == 1
    assert report["settings"]["eval_options"]["timing"] is True and not out.exists()
    assert main(["--input", str(kb_parquet), "--output", str(out), "--min-speedup", "1.0"]) == 2


def test_without_server_recipe_and_exclusions(kb_parquet, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("kernel_rl:\n  episode:\n    prompt:\n      system: Be brief.\n      one_shot: true\n")
    prompts = tmp_path / "kb.jsonl"
    reference = next(r for r in kernelbook_rows() if r["uuid"] == 2)["python_code"]
    kb_ref = to_reference(parse_kernelbook_row(next(r for r in kernelbook_rows() if r["uuid"] == 2), 0))
    assert kb_ref != reference
    write_prompt_records(
        prompts,
        [PromptRecord("kb_L1_001", 1, "1_X", "X", kb_ref.replace("import torch\n", "import torch  # kb\n"))],
    )
    out = tmp_path / "sft.jsonl"
    rc = main(
        ["--input", str(kb_parquet), "--output", str(out), "--recipe", str(recipe)]
        + ["--exclude-problems", str(prompts), "--report", str(tmp_path / "r.json"), *LIMITS]
    )
    assert rc == 0
    examples = load_sft_jsonl(out)
    assert [e.metadata["key"] for e in examples] == ["1", "7"]  # 2 is a KernelBench problem now
    assert all(e.metadata["verified"] is False for e in examples)
    assert examples[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert "Example of the expected answer format" in examples[0].messages[1]["content"]
    assert json.loads((tmp_path / "r.json").read_text())["dropped"]["overlaps_eval_problem"] == 1


def test_token_limit_and_jobs(kb_parquet, tmp_path):
    out = tmp_path / "sft.jsonl"
    tok = write_word_tokenizer(tmp_path / "tok")
    assert main(["--input", str(kb_parquet), "--output", str(out), "--jobs", "2", *LIMITS]) == 0
    examples = load_sft_jsonl(out)
    assert sorted(e.metadata["key"] for e in examples) == ["1", "2", "7"]
    sizes = sorted(token_counter(tok)(e) for e in examples)
    limit = str(sizes[1])  # the longest example is over it
    rc = main(
        ["--input", str(kb_parquet), "--output", str(out), "--tokenizer", tok, "--max-tokens", limit, *LIMITS]
    )
    assert rc == 0 and len(load_sft_jsonl(out)) == 2
    report = json.loads((tmp_path / "sft.report.json").read_text())
    assert report["dropped"]["too_many_tokens"] == 1 and report["kept_single_turn"] == 2
    assert main(["--input", str(kb_parquet), "--output", str(out), "--tokenizer", tok]) == 2


def test_refusals_write_nothing(kb_parquet, tmp_path, capsys):
    out = tmp_path / "sft.jsonl"
    assert main(["--input", str(kb_parquet), "--output", str(out), "--mutate"]) == 2
    assert "need --verify-url" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"python_code": "x", "entry_point": "A"}) + "\n")
    assert main(["--input", str(bad), "--output", str(out)]) == 2
    assert "missing column(s) ['triton_code']" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    args = ["--input", str(kb_parquet), "--output", str(out), "--verify-url", dead, "--eval-retries", "0"]
    rc = main([*args, *LIMITS])
    assert rc == 3 and "eval server" in capsys.readouterr().err
    only_bad = tmp_path / "only_bad.jsonl"
    only_bad.write_text(json.dumps(kernelbook_rows()[5]) + "\n")
    assert main(["--input", str(only_bad), "--output", str(out), "--no-progress"]) == 1
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.jsonl",
        "kernelbook.parquet",
        "only_bad.jsonl",
        "sft.report.json",
    ]
