"""Extract the candidate kernel source from a model response.

Rules (in order):
1. Drop every `<think>...</think>` block. A think block that is opened but never closed (the
   model ran out of tokens while thinking) swallows the rest of the response. A stray `</think>`
   without an opening tag (some chat templates put `<think>` in the prompt, so the response
   starts inside the block) drops everything up to and including it.
2. Take the LAST fenced code block whose language tag is `python`, `py` or empty (plain ```).
   Blocks tagged with another language (```bash, ```text) are ignored. An unterminated final
   fence (the response was cut off) is not a block.
3. Return its content (stripped of surrounding blank lines), or None when there is no such block
   or it is empty.
"""

from __future__ import annotations

import re

__all__ = ["extract_candidate", "strip_think"]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE
)
_PYTHON_TAGS = {"", "python", "py", "python3"}


def strip_think(text: str) -> str:
    """The response without its reasoning: closed blocks removed, an open block cuts the rest."""
    if "</think>" in text and ("<think>" not in text or text.index("</think>") < text.index("<think>")):
        text = text.split("</think>", 1)[1]
    text = _THINK_BLOCK.sub("", text)
    start = text.find("<think>")
    if start != -1:
        text = text[:start]
    return text


def extract_candidate(text: str) -> str | None:
    """The source of the last fenced python block outside any think block, or None."""
    visible = strip_think(text)
    found: str | None = None
    for match in _FENCE.finditer(visible):
        if match.group(1).lower() in _PYTHON_TAGS:
            found = match.group(2)
    if found is None:
        return None
    found = found.strip("\n")
    return found if found.strip() else None
