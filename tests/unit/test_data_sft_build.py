"""SFT building without a server: conversion + filters + dedup + report, example layout (the RL
prompt builder's messages), first-attempt mutations and the attempts file."""

from __future__ import annotations

import json

import pytest

from bench.synthetic_data import kernelbook_rows, write_word_tokenizer
from eval_server.schema import EvalResult
from krl_common.validation import ValidationError
from slime_ext.data.kernelbook import canonical_hash, launched_kernels
from slime_ext.data.mutations import flip_arithmetic
from slime_ext.data.report import FilterReport
from slime_ext.data.sft_build import (
    Attempt,
    SFTBuildConfig,
    limit_tokens,
    multi_turn_example,
    select_pairs,
    single_turn_example,
    token_counter,
)
from slime_ext.data.sft_verify import load_attempts, mutation_attempts
from slime_ext.rollout.prompts import PromptConfig, build_messages, feedback_text

pytestmark = pytest.mark.unit

CONFIG = SFTBuildConfig(max_reference_chars=4000)


def test_select_pairs_counts_every_reason():
    report = FilterReport()
    pairs = select_pairs(kernelbook_rows(), CONFIG, report)
    assert [p.key for p in pairs] == ["1", "2", "7"]
    assert report.rows == 10
    assert dict(report.dropped) == {
        "answer_extern_kernels": 1,
        "duplicate": 1,
        "answer_no_launched_kernel": 1,
        "reference_syntax": 1,
        "too_long": 1,
        "reference_no_entry_class": 1,
        "static:static.torch_compute": 1,
    }
    assert report.examples["duplicate"] == ["4"] and "same module as row 1" in report.details["duplicate"]
    data = report.to_json()
    assert data["dropped_total"] == 7 and data["rows"] == 10
    table = report.table()
    assert "dropped: duplicate" in table and "rows read" in table
    # the per-row stage in worker processes gives the same pairs in the same order
    parallel = FilterReport()
    assert select_pairs(kernelbook_rows(), CONFIG, parallel, jobs=2) == pairs
    assert parallel.to_json() == report.to_json()


def test_filters_are_configurable():
    report = FilterReport()
    pairs = select_pairs(
        kernelbook_rows(),
        SFTBuildConfig(max_reference_chars=100_000, allow_extern_kernels=True, dedup=False),
        report,
    )
    assert [p.key for p in pairs] == ["1", "2", "3", "4", "7", "8"]
    first = select_pairs(kernelbook_rows()[:1], CONFIG, FilterReport())[0]
    report = FilterReport()
    excluded = SFTBuildConfig(
        max_reference_chars=4000, exclude_hashes=frozenset({canonical_hash(first.reference)})
    )
    assert [p.key for p in select_pairs(kernelbook_rows(), excluded, report)] == ["2", "7"]
    assert report.dropped["overlaps_eval_problem"] == 2  # row 1 and its docstring-only fork, row 4


def test_single_turn_uses_the_rl_prompt_builder():
    pair = select_pairs(kernelbook_rows()[:1], CONFIG, FilterReport())[0]
    prompt = PromptConfig(one_shot=True, system="custom system")
    example = single_turn_example(pair, prompt)
    assert example.messages[:-1] == build_messages(pair.reference, prompt)
    assert example.messages[-1]["content"] == f"```python\n{pair.answer.strip()}\n```"
    assert example.metadata["turns"] == 1 and example.metadata["key"] == "1"
    assert example.metadata["kernelbook"]["licenses"] == ["MIT"]


def test_multi_turn_layout():
    pair = select_pairs(kernelbook_rows()[:1], CONFIG, FilterReport())[0]
    result = EvalResult(status="incorrect", compiled=True, feedback="Status: incorrect. max abs diff 3.0")
    attempt = Attempt(key=pair.key, candidate="bad code", source="attempts-file")
    example = multi_turn_example(pair, attempt, result, PromptConfig())
    roles = [(m["role"], m.get("step_loss_mask", 1)) for m in example.messages]
    assert roles == [("system", 1), ("user", 1), ("assistant", 0), ("user", 1), ("assistant", 1)]
    assert example.messages[3]["content"] == feedback_text(result)
    assert example.metadata["first_attempt_status"] == "incorrect"
    assert example.metadata["role"] == "fixer"
    assert single_turn_example(pair, PromptConfig()).metadata["role"] == "generator"
    # the recipe's fixer wording reaches the SFT example, as it reaches the RL episode
    from slime_ext.rollout.roles import RolePrompt

    worded = multi_turn_example(pair, attempt, result, PromptConfig(roles={"fixer": RolePrompt(preamble="FIXER")}))
    assert worded.messages[3]["content"].startswith("FIXER\n\n")


def test_flip_arithmetic_changes_one_operator_in_a_launched_kernel():
    pairs = select_pairs(kernelbook_rows(), CONFIG, FilterReport())
    for pair in pairs:
        variant = flip_arithmetic(pair.answer, salt=pair.key)
        assert variant is not None and variant != pair.answer
        changed = [
            (a, b) for a, b in zip(pair.answer.splitlines(), variant.splitlines(), strict=True) if a != b
        ]
        assert len(changed) == 1
        old, new = changed[0]
        assert old.lstrip().startswith("tmp") and sorted(set(old) ^ set(new)) in (["*", "+"], ["+", "-"])
        assert flip_arithmetic(pair.answer, salt=pair.key) == variant  # deterministic
        assert launched_kernels(variant) == launched_kernels(pair.answer)
    assert len(mutation_attempts(pairs)) == 3
    assert (
        flip_arithmetic("import triton\nclass ModelNew:\n    def forward(self, x):\n        return x\n")
        is None
    )


def test_load_attempts(tmp_path):
    path = tmp_path / "attempts.jsonl"
    path.write_text(
        json.dumps({"key": 2, "candidate": "x = 1"})
        + "\n"
        + json.dumps({"key": "7", "candidate": "y", "source": "m"})
    )
    assert load_attempts(str(path)) == [
        Attempt("2", "x = 1", "attempts-file"),
        Attempt("7", "y", "m"),
    ]
    path.write_text(json.dumps({"key": 2}))
    with pytest.raises(ValidationError, match=r"attempts.jsonl#row=0.candidate: missing required field"):
        load_attempts(str(path))
    path.write_text(json.dumps({"key": 2, "candidate": "x", "score": 1}))
    with pytest.raises(ValidationError, match=r"unknown field\(s\) \['score'\]"):
        load_attempts(str(path))


def test_token_limit_counts_the_rendered_conversation(tmp_path):
    import re

    pairs = select_pairs(kernelbook_rows(), CONFIG, FilterReport())
    examples = [single_turn_example(p, PromptConfig()) for p in pairs]
    result = EvalResult(status="incorrect", feedback="wrong")
    examples.append(multi_turn_example(pairs[0], Attempt(pairs[0].key, "bad", "x"), result, PromptConfig()))
    count = token_counter(write_word_tokenizer(tmp_path / "tok"))
    expected = [
        len(re.findall(r"\w+|[^\w\s]+", "".join(f"<{m['role']}> {m['content']}\n" for m in e.messages)))
        for e in examples
    ]
    assert [count(e) for e in examples] == expected
    limit = sorted(expected)[1]  # keeps the two shortest
    report = FilterReport()
    kept = limit_tokens(examples, count, limit, report)
    assert [count(e) for e in kept] == [n for n in expected if n <= limit] and len(kept) == 2
    dropped = sum(report.dropped.values()) + sum(report.multi_turn_skipped.values())
    assert dropped == 2 and set(report.dropped) | set(report.multi_turn_skipped) == {"too_many_tokens"}
