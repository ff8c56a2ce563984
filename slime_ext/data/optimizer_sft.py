"""Optimizer-role SFT examples: for one problem, a slower and a faster correct kernel,
both evaluated with timing, become `prompt -> slower kernel (context, not trained) -> its real
feedback handed to the optimizer -> the faster kernel (trained)`. A pair is kept only when the
evaluator measured the faster one correct and faster by at least `min_gain` (its speedup over the
slower one's); an untimed evaluation (the CPU evaluator) cannot order a pair and keeps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eval_server.schema import EvalResult, problem_hash
from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.data.second_turn import second_turn_messages
from slime_ext.data.sft_format import SFTExample
from slime_ext.rollout.prompts import PromptConfig
from slime_ext.rollout.roles import OPTIMIZER, role_after

__all__ = ["KernelPair", "optimizer_example", "pair_verdict", "parse_kernel_pair"]

_PAIR_KEYS = {"key", "reference", "slower", "faster"}


@dataclass(frozen=True)
class KernelPair:
    key: str
    reference: str  # KernelBench-format problem source
    slower: str  # a correct kernel module
    faster: str  # a correct kernel module meant to be faster


def parse_kernel_pair(data: Any, where: str = "pair") -> KernelPair:
    """One line of a pairs jsonl: {"key", "reference", "slower", "faster"} (sources)."""
    check_type(where, data, dict)
    reject_unknown(where, data, _PAIR_KEYS)
    for name in sorted(_PAIR_KEYS):
        if name not in data:
            raise ValidationError(f"{where}.{name}: missing required field")
        check_type(f"{where}.{name}", data[name], str)
    return KernelPair(data["key"], data["reference"], data["slower"], data["faster"])


def pair_verdict(slower: EvalResult, faster: EvalResult, min_gain: float) -> str | None:
    """None when the pair makes an optimizer example, else why not (a FilterReport reason)."""
    if not (slower.correct and faster.correct):
        return "not_both_correct"
    if slower.speedup is None or faster.speedup is None:
        return "untimed"
    if faster.speedup < slower.speedup * (1.0 + min_gain):
        return "not_faster"
    return None


def optimizer_example(pair: KernelPair, slower: EvalResult, faster: EvalResult, prompt: PromptConfig) -> SFTExample:
    """prompt -> the slower kernel (context) -> its feedback, handed to the optimizer in the
    recipe's wording -> the faster kernel (trained)."""
    if role_after(slower) != OPTIMIZER:
        raise ValueError(f"{pair.key}: the slower kernel is not correct; no optimizer turn follows it")
    messages = second_turn_messages(pair.reference, pair.slower, slower, pair.faster, prompt)
    meta = {
        "source": "optimizer_pairs",
        "key": pair.key,
        "problem_hash": problem_hash(pair.reference),
        "turns": 2,
        "verified": True,
        "role": OPTIMIZER,
        "speedups": [slower.speedup, faster.speedup],
    }
    return SFTExample(messages=messages, metadata=meta)
