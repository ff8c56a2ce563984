"""The SFT example: one conversation in slime's SFT format (the one definition of that jsonl).

slime's SFT path (`--rollout-function-path slime.rollout.sft_rollout.generate_rollout
--input-key messages --loss-type sft_loss`) reads one row per conversation: `messages`, a list of
OpenAI-style `{"role", "content"}` dicts rendered with the model's chat template, where the content
of assistant messages is trained. An assistant message with `"step_loss_mask": 0` is kept in the
context but not trained (slime's MultiTurnLossMaskGenerator zeroes its mask): the failing first
attempt of a multi-turn example is such a message. `metadata` (free-form JSON) rides along.

Rules checked on write and on read: roles are system/user/assistant, a system message only comes
first, then user and assistant alternate starting with user and ending with assistant, every
content is a non-empty string, and at least one assistant message is trained.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.data.files import atomic_write_jsonl, iter_jsonl

__all__ = [
    "SFTExample",
    "assistant_message",
    "load_sft_jsonl",
    "parse_sft_example",
    "validate_messages",
    "write_sft_jsonl",
]

_MESSAGE_KEYS = {"role", "content", "step_loss_mask"}
_EXAMPLE_KEYS = {"messages", "metadata"}


def assistant_message(code: str, *, trained: bool = True) -> dict[str, Any]:
    """An assistant turn answering with one fenced python block (what the RL extractor reads)."""
    message: dict[str, Any] = {"role": "assistant", "content": f"```python\n{code.strip(chr(10))}\n```"}
    if not trained:
        message["step_loss_mask"] = 0
    return message


def validate_messages(messages: Any, where: str = "messages") -> None:
    """Raise ValidationError (naming the message index and field) unless `messages` is valid."""
    check_type(where, messages, list)
    if not messages:
        raise ValidationError(f"{where}: must not be empty")
    for i, m in enumerate(messages):
        p = f"{where}[{i}]"
        check_type(p, m, dict)
        reject_unknown(p, m, _MESSAGE_KEYS)
        for key in ("role", "content"):
            if key not in m:
                raise ValidationError(f"{p}.{key}: missing required field")
        check_type(f"{p}.content", m["content"], str)
        if not m["content"].strip():
            raise ValidationError(f"{p}.content: must not be empty")
        if "step_loss_mask" in m and (
            m["step_loss_mask"] not in (0, 1) or isinstance(m["step_loss_mask"], bool)
        ):
            raise ValidationError(f"{p}.step_loss_mask: expected 0 or 1, got {m['step_loss_mask']!r}")
    start = 1 if messages[0].get("role") == "system" else 0
    for i, m in enumerate(messages[start:], start):
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise ValidationError(f"{where}[{i}].role: expected {expected!r}, got {m['role']!r}")
    if messages[-1]["role"] != "assistant":
        raise ValidationError(f"{where}: must end with an assistant message")
    if not any(m["role"] == "assistant" and m.get("step_loss_mask", 1) == 1 for m in messages):
        raise ValidationError(f"{where}: no trained assistant message (every step_loss_mask is 0)")


@dataclass(frozen=True)
class SFTExample:
    messages: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_messages(self.messages)
        check_type("metadata", self.metadata, dict)

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.messages, "metadata": self.metadata}


def parse_sft_example(data: Any, where: str = "example") -> SFTExample:
    check_type(where, data, dict)
    reject_unknown(where, data, _EXAMPLE_KEYS)
    if "messages" not in data:
        raise ValidationError(f"{where}.messages: missing required field")
    validate_messages(data["messages"], f"{where}.messages")
    metadata = data.get("metadata", {})
    check_type(f"{where}.metadata", metadata, dict)
    return SFTExample(messages=data["messages"], metadata=metadata)


def write_sft_jsonl(path: str | os.PathLike[str], examples: Iterable[SFTExample]) -> int:
    """Write the SFT jsonl atomically; returns the number of examples."""
    return atomic_write_jsonl(path, (e.to_json() for e in examples))


def load_sft_jsonl(path: str | os.PathLike[str]) -> list[SFTExample]:
    """Read and validate an SFT jsonl; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"SFT data not found: {p}")
    return [parse_sft_example(data, f"{p}:{lineno}") for lineno, data in iter_jsonl(p)]
