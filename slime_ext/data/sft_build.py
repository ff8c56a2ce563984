"""KernelBook -> slime SFT examples: conversion, filters, dedup, optional verification on the
eval server, and multi-turn examples with real evaluator feedback.

Stages (each dropped row is counted in the FilterReport under its reason):
1. `select_pairs`: row -> (reference, answer) (kernelbook.py); answers that the RL reward would
   reject (torch/cuBLAS via extern_kernels, no launched kernel, eval-server static rules);
   length limits; modules that are also evaluation problems; duplicates (same module AST).
2. `verify_pairs` (optional, `--verify-url`): the answer must evaluate `ok` against its reference.
3. `multi_turn_examples` (needs verification): for each verified pair with a first attempt (from
   an attempts file, or a `flip_arithmetic` variant), evaluate the attempt; if it fails, the
   example is prompt -> attempt (untrained) -> the evaluator's feedback -> the verified answer.
Prompts are built by `slime_ext.prompts.build_messages`, the RL prompt builder, with the same
PromptConfig, and feedback turns by `slime_ext.prompts.feedback_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tqdm import tqdm

from eval_server.schema import STATUS_OK, STATUS_REFERENCE_ERROR, STATUS_SERVER_ERROR, EvalOptions, EvalResult
from eval_server.schema import problem_hash as sha256_of
from slime_ext.data.files import read_rows
from slime_ext.data.kernelbook import (
    Rejected,
    answer_rejection,
    canonical_hash,
    parse_kernelbook_row,
    to_answer,
    to_reference,
)
from slime_ext.data.mutations import flip_arithmetic
from slime_ext.data.report import FilterReport
from slime_ext.data.sft_format import SFTExample, assistant_message
from slime_ext.eval_client import EvalClient, EvalRequestError
from slime_ext.prompts import PromptConfig, build_messages, feedback_message
from slime_ext.validation import ValidationError, check_type, reject_unknown

__all__ = [
    "Attempt",
    "Pair",
    "SFTBuildConfig",
    "convert_row",
    "load_attempts",
    "multi_turn_example",
    "limit_tokens",
    "multi_turn_examples",
    "mutation_attempts",
    "token_counter",
    "select_pairs",
    "single_turn_example",
    "verify_pairs",
]

T = TypeVar("T")
R = TypeVar("R")


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
        "source": "kernelbook",
        "key": pair.key,
        "problem_hash": sha256_of(pair.reference),
        "turns": turns,
        **extra,
        "kernelbook": pair.metadata,
    }


def single_turn_example(pair: Pair, prompt: PromptConfig, verified: bool = False) -> SFTExample:
    messages = [*build_messages(pair.reference, prompt), assistant_message(pair.answer)]
    return SFTExample(messages=messages, metadata=_metadata(pair, 1, verified=verified))


def multi_turn_example(pair: Pair, attempt: Attempt, result: EvalResult, prompt: PromptConfig) -> SFTExample:
    """prompt -> failing attempt (not trained) -> real feedback -> the verified answer."""
    messages = [
        *build_messages(pair.reference, prompt),
        assistant_message(attempt.candidate, trained=False),
        feedback_message(result, prompt),
        assistant_message(pair.answer),
    ]
    meta = _metadata(
        pair, 2, verified=True, first_attempt_status=result.status, first_attempt_source=attempt.source
    )
    return SFTExample(messages=messages, metadata=meta)


async def _bounded(
    items: Sequence[T], fn: Callable[[T], Awaitable[R]], concurrency: int, desc: str, progress: bool
) -> list[R]:
    """fn over items with at most `concurrency` in flight; results in input order."""
    sem = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=len(items), desc=desc, disable=not progress, unit="eval")

    async def one(item: T) -> R:
        async with sem:
            try:
                return await fn(item)
            finally:
                bar.update(1)

    try:
        return list(await asyncio.gather(*(one(i) for i in items)))
    finally:
        bar.close()


async def _evaluate(
    client: EvalClient, reference: str, candidate: str, options: EvalOptions, key: str
) -> EvalResult | str:
    """The result, or the server's refusal message (a 4xx: e.g. a source over its size limit).
    Unavailable servers and timeouts propagate: they say nothing about the data."""
    try:
        return await client.evaluate_source(reference, candidate, options=options, problem_id=key)
    except EvalRequestError as exc:
        return exc.message


async def verify_pairs(
    pairs: Sequence[Pair],
    client: EvalClient,
    options: EvalOptions,
    report: FilterReport,
    *,
    concurrency: int = 4,
    progress: bool = False,
) -> list[Pair]:
    """The pairs whose answer evaluates `ok` against their reference, in order."""

    async def check(pair: Pair) -> EvalResult | str:
        return await _evaluate(client, pair.reference, pair.answer, options, pair.key)

    results = await _bounded(pairs, check, concurrency, "verify", progress)
    kept: list[Pair] = []
    for pair, result in zip(pairs, results, strict=True):
        if isinstance(result, str):
            report.drop("verify:refused", pair.key, result)
        elif result.status != STATUS_OK:
            report.drop(f"verify:{result.status}", pair.key, result.feedback)
        else:
            kept.append(pair)
    return kept


def load_attempts(path: str) -> list[Attempt]:
    """First attempts from a table file: rows `{"key": <KernelBook uuid>, "candidate": <source>}`
    (e.g. a model's samples); an optional `source` labels where they came from."""
    attempts = []
    for i, row in enumerate(read_rows(path)):
        where = f"{path}#row={i}"
        reject_unknown(where, row, {"key", "candidate", "source"})
        for name in ("key", "candidate"):
            if name not in row:
                raise ValidationError(f"{where}.{name}: missing required field")
        check_type(f"{where}.key", row["key"], str | int)
        check_type(f"{where}.candidate", row["candidate"], str)
        if not row["candidate"].strip():
            raise ValidationError(f"{where}.candidate: must not be empty")
        source = row.get("source", "attempts-file")
        check_type(f"{where}.source", source, str)
        attempts.append(Attempt(key=str(row["key"]), candidate=row["candidate"], source=source))
    return attempts


def mutation_attempts(pairs: Sequence[Pair]) -> list[Attempt]:
    """One `flip_arithmetic` variant per pair that has an operator to flip."""
    out = []
    for pair in pairs:
        variant = flip_arithmetic(pair.answer, salt=pair.key)
        if variant is not None:
            out.append(Attempt(key=pair.key, candidate=variant, source="mutation:flip_arithmetic"))
    return out


async def multi_turn_examples(
    pairs: Sequence[Pair],
    attempts: Sequence[Attempt],
    client: EvalClient,
    options: EvalOptions,
    prompt: PromptConfig,
    report: FilterReport,
    *,
    concurrency: int = 4,
    progress: bool = False,
) -> list[SFTExample]:
    """Evaluate each attempt of a verified pair; a failing one becomes a two-turn example.
    Attempts for unknown or unverified rows, and attempts that pass, are counted, not used."""
    by_key = {p.key: p for p in pairs}
    usable: list[tuple[Pair, Attempt]] = []
    for a in attempts:
        if a.key in by_key:
            usable.append((by_key[a.key], a))
        else:
            report.skip_attempt("no_verified_answer", a.key)

    async def run(item: tuple[Pair, Attempt]) -> EvalResult | str:
        pair, attempt = item
        return await _evaluate(client, pair.reference, attempt.candidate, options, pair.key)

    results = await _bounded(usable, run, concurrency, "attempts", progress)
    examples: list[SFTExample] = []
    for (pair, attempt), result in zip(usable, results, strict=True):
        if isinstance(result, str):
            report.skip_attempt("refused", pair.key, result)
        elif result.status == STATUS_OK:
            report.skip_attempt("attempt_passed", pair.key, attempt.source)
        elif result.status in (STATUS_REFERENCE_ERROR, STATUS_SERVER_ERROR):
            report.skip_attempt(result.status, pair.key, result.feedback)
        else:
            examples.append(multi_turn_example(pair, attempt, result, prompt))
    return examples


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
