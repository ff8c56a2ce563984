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
"""

from __future__ import annotations

from collections.abc import Sequence

from eval_server import samples
from slime_ext.data.mutations import flip_arithmetic
from slime_ext.data.sft_format import SFTExample, assistant_message
from slime_ext.rollout.prompts import PromptConfig, build_messages

__all__ = ["WRONG_STATUSES", "problems_with_wrong_answers", "sample_sft_examples"]

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
