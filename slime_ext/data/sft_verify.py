"""The SFT stages that need the eval server: verifying answers and turning failing first
attempts into two-turn examples whose second user turn is the evaluator's real feedback.

- `verify_pairs`: keep the pairs whose answer evaluates `ok` against its reference.
- first attempts: `load_attempts` (a table of `{key, candidate}`, e.g. a model's samples) and
  `mutation_attempts` (`mutations.flip_arithmetic` variants of the verified answers).
- `multi_turn_examples`: evaluate each attempt; a failing one becomes prompt -> attempt (not
  trained) -> `feedback_message(result)` -> the verified answer.
Every request names the kernel backend of the answers (`backend`: triton or cuda).
A 4xx answer (the server refused the request) is counted as `refused`; an unavailable server or a
timeout raises (EvalClientError): it says nothing about the data.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from tqdm import tqdm

from eval_server.schema import STATUS_OK, STATUS_REFERENCE_ERROR, STATUS_SERVER_ERROR, EvalOptions, EvalResult
from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.clients.backends import DEFAULT_BACKEND
from slime_ext.clients.eval_client import EvalClient, EvalRequestError
from slime_ext.data.files import read_rows
from slime_ext.data.mutations import flip_arithmetic
from slime_ext.data.report import FilterReport
from slime_ext.data.sft_build import Attempt, Pair, multi_turn_example
from slime_ext.data.sft_format import SFTExample
from slime_ext.rollout.prompts import PromptConfig

__all__ = ["load_attempts", "multi_turn_examples", "mutation_attempts", "verify_pairs"]

T = TypeVar("T")
R = TypeVar("R")


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
    client: EvalClient, reference: str, candidate: str, options: EvalOptions, key: str, backend: str
) -> EvalResult | str:
    """The result, or the server's refusal message (a 4xx: e.g. a source over its size limit).
    Unavailable servers and timeouts propagate: they say nothing about the data."""
    try:
        return await client.evaluate_source(
            reference, candidate, options=options, problem_id=key, backend=backend
        )
    except EvalRequestError as exc:
        return exc.message


async def verify_pairs(
    pairs: Sequence[Pair],
    client: EvalClient,
    options: EvalOptions,
    report: FilterReport,
    *,
    min_speedup: float | None = None,
    concurrency: int = 4,
    progress: bool = False,
    backend: str = DEFAULT_BACKEND,
) -> list[Pair]:
    """The pairs whose answer evaluates `ok` against their reference, in order. With
    `min_speedup`, also at least that fast against the reference (timed on the server's GPU):
    slower answers are `verify:slow`, results without timing (a CPU server) `verify:no_timing`."""
    if min_speedup is not None:
        options = dataclasses.replace(options, timing=True)

    async def check(pair: Pair) -> EvalResult | str:
        return await _evaluate(client, pair.reference, pair.answer, options, pair.key, backend)

    results = await _bounded(pairs, check, concurrency, "verify", progress)
    kept: list[Pair] = []
    for pair, result in zip(pairs, results, strict=True):
        if isinstance(result, str):
            report.drop("verify:refused", pair.key, result)
        elif result.status != STATUS_OK:
            report.drop(f"verify:{result.status}", pair.key, result.feedback)
        elif min_speedup is not None and result.speedup is None:
            report.drop("verify:no_timing", pair.key, f"no timing from {result.device or 'the server'}")
        elif min_speedup is not None and result.speedup < min_speedup:
            report.drop("verify:slow", pair.key, f"speedup {result.speedup:.3g} < {min_speedup}")
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
    backend: str = DEFAULT_BACKEND,
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
        return await _evaluate(client, pair.reference, attempt.candidate, options, pair.key, backend)

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
