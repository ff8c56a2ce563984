"""Warm-start SFT data from the bundled sample problems: for each problem, its first prompt (as the
RL episode renders it) answered once correctly and once wrongly, so a small model learns to write
kernels in the expected format and both outcomes are in its distribution; RL then has reward
variance to climb from (the closed loop's).

The correct answer is the bundled `<problem>__correct` candidate. The wrong ones are the bundled
candidates the evaluator must find incorrect or not compiling (relu: 3, softmax: 1). A problem
without any is refused unless `mutations` is on: then a deterministic arithmetic mutation of its
correct kernel (mutations.py) stands in, unverified, and not always the kind of wrong this data
wants (measured on the CPU evaluator, 2026-11-27: sum_dim's is `incorrect`, matmul's `rejected`,
gemm_scale_leakyrelu's `crashed`). Each wrong example is paired with one copy of the correct one,
so the data is half correct.

Fixer examples (`fixer_examples`) teach the second turn: each bundled wrong candidate as the first
answer (context, not trained), the evaluator's real feedback on it handed to the fixer, and the
problem's correct kernel as the second answer (trained). Only candidates the evaluator found
wrong (`incorrect` or `compile_error`) make one: the feedback is what an RL episode would show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eval_server import samples
from eval_server.schema import EvalResult
from slime_ext.data.mutations import flip_arithmetic
from slime_ext.data.second_turn import second_turn_messages
from slime_ext.data.sft_format import SFTExample, assistant_message
from slime_ext.rollout.prompts import PromptConfig, build_messages
from slime_ext.rollout.roles import FIXER

__all__ = [
    "WRONG_STATUSES",
    "fixer_examples",
    "problems_with_wrong_answers",
    "sample_sft_examples",
    "wrong_candidates",
]

WRONG_STATUSES = samples.WRONG_STATUSES


def problems_with_wrong_answers() -> list[str]:
    """The bundled problems that have bundled wrong candidates (the default problem set)."""
    return [p for p in samples.problem_names() if samples.candidates_of(p, WRONG_STATUSES)]


def _wrong_answers(problem: str, correct: str, mutations: bool) -> list[tuple[str, str, bool]]:
    """(label, source, verified) of each wrong answer of `problem`."""
    bundled = [(c, samples.load_candidate(c), True) for c in samples.candidates_of(problem, WRONG_STATUSES)]
    if bundled:
        return bundled
    if not mutations:
        raise ValueError(
            f"{problem}: no bundled wrong candidate; use problems that have one "
            f"({', '.join(problems_with_wrong_answers())}) or allow unverified mutations"
        )
    mutated = flip_arithmetic(correct, salt=problem)
    return [] if mutated is None else [(f"{problem}__mutation", mutated, False)]


def sample_sft_examples(
    names: Sequence[str], prompt: PromptConfig, *, repeat: int = 1, mutations: bool = False
) -> list[SFTExample]:
    """For each problem of `names`: (correct, wrong) example pairs, `repeat` times over."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    examples = []
    for name in names:
        reference = samples.load_problem(name)
        correct = samples.load_candidate(f"{name}__correct")
        wrong = _wrong_answers(name, correct, mutations)
        if not wrong:
            raise ValueError(f"{name}: no wrong answer (no bundled one and nothing to mutate)")
        for _ in range(repeat):
            for label, source, verified in wrong:
                for cand, text, is_correct, checked in (
                    (f"{name}__correct", correct, True, True),
                    (label, source, False, verified),
                ):
                    messages = [*build_messages(reference, prompt), assistant_message(text)]
                    meta = {"source": "bundled_samples", "problem": name, "candidate": cand,
                            "correct": is_correct, "status_verified": checked}  # fmt: skip
                    examples.append(SFTExample(messages=messages, metadata=meta))
    return examples


def wrong_candidates(names: Sequence[str]) -> list[tuple[str, str]]:
    """(problem, candidate) of every bundled wrong candidate of `names`: what fixer examples need
    evaluated."""
    return [(name, c) for name in names for c in samples.candidates_of(name, WRONG_STATUSES)]


def fixer_examples(
    names: Sequence[str], prompt: PromptConfig, results: Mapping[str, EvalResult], *, repeat: int = 1
) -> tuple[list[SFTExample], dict[str, str]]:
    """For each bundled wrong candidate of `names` the evaluator found wrong (`results`, by
    candidate name): prompt -> it (context) -> its feedback to the fixer -> the correct kernel
    (trained), `repeat` times. Also returns, per candidate left out, why."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    examples: list[SFTExample] = []
    left_out: dict[str, str] = {}
    for name in names:
        reference, correct = samples.load_problem(name), samples.load_candidate(f"{name}__correct")
        for _, cand in wrong_candidates([name]):
            result = results.get(cand)
            if result is None:
                left_out[cand] = "not evaluated"
                continue
            if result.status not in WRONG_STATUSES:
                left_out[cand] = (
                    f"the evaluator said {result.status!r}, not one of {', '.join(WRONG_STATUSES)}"
                )
                continue
            messages = second_turn_messages(reference, samples.load_candidate(cand), result, correct, prompt)
            meta = {"source": "bundled_samples", "problem": name, "candidate": f"{name}__correct",
                    "first_candidate": cand, "first_status": result.status, "turns": 2, "role": FIXER,
                    "correct": True, "status_verified": True}  # fmt: skip
            examples += [SFTExample(messages=messages, metadata=meta) for _ in range(repeat)]
    return examples, left_out
