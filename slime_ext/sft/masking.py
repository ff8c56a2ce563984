"""Token ids and the loss mask of one SFT conversation, as the model's chat template renders it.

Trained: the tokens each trained assistant turn adds (its content and the end-of-turn tokens the
template writes), not its role header and not the system or user turns; an assistant message with
`step_loss_mask: 0` (context only, e.g. a failed first attempt) is not trained. The same rule as
slime's SFT loss mask, computed from prefixes: the tokens of turn i are those between the render
of messages[:i] with the generation prompt (the header) and the render of messages[:i+1].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TemplateError", "tokenize_conversation"]


class TemplateError(ValueError):
    """The chat template does not render a conversation as the concatenation of its turns."""


def _ids(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> list[int]:
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    out = tokenizer.apply_chat_template(
        plain, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    return list(out["input_ids"] if isinstance(out, dict) else out)


def tokenize_conversation(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of `messages` (slime_ext/data/sft_format.py's `messages`)."""
    full = _ids(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or message.get("step_loss_mask", 1) == 0:
            continue
        head = _ids(tokenizer, messages[:i], generation_prompt=True)
        upto = _ids(tokenizer, messages[: i + 1], generation_prompt=False)
        if full[: len(head)] != head or full[: len(upto)] != upto or len(upto) <= len(head):
            raise TemplateError(
                f"the chat template does not render turn {i} (assistant) as an extension of the turns "
                "before it, so its tokens cannot be told apart; use a tokenizer whose template renders "
                "past turns unchanged"
            )
        mask[len(head) : len(upto)] = [1] * (len(upto) - len(head))
    return full, mask
