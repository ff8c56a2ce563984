"""Two-turn SFT conversations: a first answer shown as context (not trained), the evaluator's real
feedback on it handed to the role that follows it (fixer after a wrong answer, optimizer after a
correct one) in the recipe's wording, and the second answer (trained). The one shape of the
fixer examples (sample_sft.py) and the optimizer examples (optimizer_sft.py), so a warm-started
model sees its second turn exactly as the RL episode will show it.
"""

from __future__ import annotations

from eval_server.schema import EvalResult
from slime_ext.data.sft_format import assistant_message
from slime_ext.rollout.prompts import PromptConfig, build_messages, feedback_message

__all__ = ["second_turn_messages"]


def second_turn_messages(
    reference: str, first: str, first_result: EvalResult, second: str, prompt: PromptConfig
) -> list[dict]:
    """prompt -> `first` (context) -> the feedback on `first_result` -> `second` (trained)."""
    return [
        *build_messages(reference, prompt),
        assistant_message(first, trained=False),
        feedback_message(first_result, prompt),
        assistant_message(second),
    ]
