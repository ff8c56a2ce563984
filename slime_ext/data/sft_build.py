"""KernelBook -> slime SFT examples: conversion, filters, dedup, example layout, token limits.
The stages that need the eval server (verification, multi-turn attempts) are in `sft_verify.py`.

Stages (each dropped row is counted in the FilterReport under its reason):
1. `select_pairs`: row -> (reference, answer) (kernelbook.py); answers that the RL reward would
   reject (torch/cuBLAS via extern_kernels, no launched kernel, eval-server static rules);
   length limits; modules that are also evaluation problems; duplicates (same module AST).
2. `verify_pairs` (optional, `--verify-url`): the answer must evaluate `ok` against its reference.
3. `multi_turn_examples` (needs verification): for each verified pair with a first attempt (from
   an attempts file, or a `flip_arithmetic` variant), evaluate the attempt; if it fails, the
   example is prompt -> attempt (untrained) -> the evaluator's feedback -> the verified answer.
Prompts are built by `slime_ext.rollout.prompts.build_messages`, the RL prompt builder, with the same
PromptConfig, and feedback turns by `slime_ext.rollout.prompts.feedback_message`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eval_server.schema import EvalResult
from eval_server.schema import problem_hash as sha256_of
from slime_ext.data.kernelbook import (
    Rejected,
    answer_rejection,
    canonical_hash,
    parse_kernelbook_row,
    to_answer,
    to_reference,
)
from slime_ext.data.report import FilterReport
from slime_ext.data.sft_format import SFTExample, assistant_message
from slime_ext.rollout.prompts import PromptConfig, build_messages, feedback_message
from slime_ext.rollout.roles import GENERATOR, role_after

__all__ = [
    "Attempt",
    "Pair",
    "SFTBuildConfig",
    "convert_row",
    "multi_turn_example",
    "limit_tokens",
    "token_counter",
    "select_pairs",
    "single_turn_example",
]


@dataclass(frozen=True)
class SFTBuildConfig:
    max_reference_chars: int = 8_000
    max_answer_chars: int = 20_000
    allow_extern_kernels: bool = False  # keep answers whose matmul/conv run in torch/cuBLAS
    dedup: bool = True
    exclude_hashes: frozenset[str] = frozenset()  # canonical_hash of evaluation problems
    prompt: PromptConfig = field(default_factory=PromptConfig)


@dataclass(frozen=True)
class Pair:
    key: str
    reference: str
    answer: str
    metadata: dict[str, Any]
    source: str = "kernelbook"  # the dataset (slime_ext/data/kernelbook.py, sakana.py): metadata key


@dataclass(frozen=True)
class Attempt:
    key: str  # the KernelBook row key (uuid) it answers
    candidate: str
    source: str  # "attempts-file" | "mutation:flip_arithmetic"


@dataclass(frozen=True)
class _Converted:
    """One row after the per-row stage: a pair and its dedup key, or why it was dropped."""

    key: str
    pair: Pair | None = None
    digest: str = ""
    reason: str = ""
    detail: str = ""


def convert_row(item: tuple[int, Mapping[str, Any]], config: SFTBuildConfig, where: str = "") -> _Converted:
    """Everything that depends on one row alone (conversion, length, answer checks, dedup key);
    a pure function of its arguments, so rows can be converted in worker processes."""
    index, data = item
    uuid = data.get("uuid")
    key = str(uuid) if uuid is not None else f"row{index}"  # as parse_kernelbook_row names it
    try:
        row = parse_kernelbook_row(data, index, where)
        reference = to_reference(row)
        answer = to_answer(row)
        if len(reference) > config.max_reference_chars or len(answer) > config.max_answer_chars:
            detail = f"reference {len(reference)} chars, answer {len(answer)} chars"
            return _Converted(key, reason="too_long", detail=detail)
        rejection = answer_rejection(answer, allow_extern_kernels=config.allow_extern_kernels)
        if rejection is not None:
            raise rejection
    except Rejected as r:
        return _Converted(key, reason=r.reason, detail=r.detail)
    metadata = {"entry_point": row.entry_point, **row.metadata}
    pair = Pair(key=key, reference=reference, answer=answer, metadata=metadata)
    return _Converted(key, pair=pair, digest=canonical_hash(reference))


def select_pairs(
    rows: Iterable[Mapping[str, Any]],
    config: SFTBuildConfig,
    report: FilterReport,
    where: str = "",
    *,
    jobs: int = 1,
) -> list[Pair]:
    """Convert and filter rows in order (`jobs` > 1: the per-row stage in that many processes);
    the first of duplicate modules is kept."""
    convert = functools.partial(convert_row, config=config, where=where)
    pairs: list[Pair] = []
    seen: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs))
            results: Iterable[_Converted] = pool.map(convert, enumerate(rows), chunksize=16)
        else:
            results = map(convert, enumerate(rows))
        for c in results:
            report.rows += 1
            if c.pair is None:
                report.drop(c.reason, c.key, c.detail)
            elif c.digest in config.exclude_hashes:
                report.drop("overlaps_eval_problem", c.key)
            elif config.dedup and c.digest in seen:
                report.drop("duplicate", c.key, f"same module as row {seen[c.digest]}")
            else:
                seen[c.digest] = c.key
                pairs.append(c.pair)
    return pairs


def _metadata(pair: Pair, turns: int, **extra: Any) -> dict[str, Any]:
    return {
        "source": pair.source,
        "key": pair.key,
        "problem_hash": sha256_of(pair.reference),
        "turns": turns,
        **extra,
        pair.source: pair.metadata,
    }


def single_turn_example(pair: Pair, prompt: PromptConfig, verified: bool = False) -> SFTExample:
    messages = [*build_messages(pair.reference, prompt), assistant_message(pair.answer)]
    return SFTExample(messages=messages, metadata=_metadata(pair, 1, verified=verified, role=GENERATOR))


def multi_turn_example(pair: Pair, attempt: Attempt, result: EvalResult, prompt: PromptConfig) -> SFTExample:
    """prompt -> failing attempt (not trained) -> real feedback -> the verified answer, which
    plays the role the feedback hands the turn to (roles.py: the fixer after a failed attempt),
    in that role's wording when `prompt` sets one."""
    messages = [
        *build_messages(pair.reference, prompt),
        assistant_message(attempt.candidate, trained=False),
        feedback_message(result, prompt),
        assistant_message(pair.answer),
    ]
    meta = _metadata(
        pair, 2, verified=True, first_attempt_status=result.status, first_attempt_source=attempt.source,
        role=role_after(result),
    )  # fmt: skip
    return SFTExample(messages=messages, metadata=meta)


def token_counter(
    tokenizer_path: str, chat_template_kwargs: Mapping[str, Any] | None = None
) -> Callable[[SFTExample], int]:
    """Tokens of a whole example as slime's SFT path sees it: the conversation rendered with the
    model's chat template, then tokenized (`transformers` and a local tokenizer directory)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    kwargs = dict(chat_template_kwargs or {})

    def count(example: SFTExample) -> int:
        messages = [{"role": m["role"], "content": m["content"]} for m in example.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def limit_tokens(
    examples: Sequence[SFTExample], count: Callable[[SFTExample], int], max_tokens: int, report: FilterReport
) -> list[SFTExample]:
    """The examples of at most `max_tokens` tokens; longer ones are counted as `too_many_tokens`
    (single-turn under `dropped`, multi-turn under `multi_turn_skipped`)."""
    kept = []
    for example in examples:
        n = count(example)
        if n <= max_tokens:
            kept.append(example)
        elif example.turns == 1:
            report.drop("too_many_tokens", example.metadata["key"], f"{n} tokens > {max_tokens}")
        else:
            report.skip_attempt("too_many_tokens", example.metadata["key"], f"{n} tokens > {max_tokens}")
    return kept
