"""Prompt and feedback messages for the kernel-writing task (every template lives here).

A prompt is a list of chat messages (`{"role", "content"}`), rendered later with the model's own
chat template (`slime_ext/chat.py`). `PromptConfig` holds every template, so a run can change the
wording from a config file without touching code; the defaults are the recipe's wording.

- `build_messages(reference, config)`: system message + the first user message (the reference
  module, the rules for `ModelNew`, the output format, optionally a one-shot ReLU example).
- `feedback_message(result, config)`: the next user turn after an evaluation: the evaluator's
  `feedback` text plus a short instruction (fix it, or make it faster), asking again for the
  whole module in one fenced python block.
- `no_code_feedback(config)`: the next user turn when the response had no fenced python block.
- `refused_feedback(error, config)`: the next user turn when the eval server refused the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval_server.schema import EvalResult

__all__ = [
    "DEFAULT_EXAMPLE",
    "PromptConfig",
    "build_messages",
    "feedback_message",
    "feedback_text",
    "no_code_feedback",
    "refused_feedback",
]

DEFAULT_SYSTEM = (
    "You are an expert GPU programmer. You rewrite PyTorch modules as fast, correct Triton kernels."
)

DEFAULT_INSTRUCTIONS = """\
Write `class ModelNew(nn.Module)` that replaces `Model` below.

Rules:
- `ModelNew` has the same constructor arguments and the same `forward` signature as `Model`, and returns the same outputs (same shapes and dtypes, numerically equal within tolerance).
- `forward` must launch one or more `@triton.jit` kernels that do all of the math. Do not call torch operators (torch.matmul, torch.relu, F.*, tensor arithmetic, ...) to compute the result; allocating outputs (torch.empty, torch.empty_like) and reshaping views are fine.
- Do not copy, subclass or call `Model`, and do not fall back to PyTorch in a try/except.
- Import everything you use (torch, torch.nn as nn, triton, triton.language as tl).
- Make it fast: the speed of your `ModelNew` is compared with the reference.

Return the whole module (imports, kernels and `ModelNew`) in ONE fenced ```python code block."""

DEFAULT_REFERENCE_HEADER = "Here is the reference PyTorch module:"

DEFAULT_EXAMPLE_HEADER = "Example of the expected answer format, for an elementwise ReLU:"

DEFAULT_EXAMPLE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK_SIZE = 1024
        relu_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK_SIZE=BLOCK_SIZE)
        return out"""

DEFAULT_FIX_INSTRUCTION = (
    "Fix the problem above and return the full corrected module again, in ONE fenced ```python block."
)
DEFAULT_FASTER_INSTRUCTION = (
    "Your kernel is correct. Make it faster, and return the full module again, in ONE fenced ```python block."
)
DEFAULT_NO_CODE_FEEDBACK = (
    "Your answer contained no fenced ```python code block, so nothing could be evaluated. "
    "Return the full module, with `class ModelNew(nn.Module)`, in ONE fenced ```python block."
)


@dataclass(frozen=True)
class PromptConfig:
    """Every piece of prompt text. `one_shot` adds the ReLU example to the first user message."""

    system: str | None = DEFAULT_SYSTEM  # None: no system message
    instructions: str = DEFAULT_INSTRUCTIONS
    reference_header: str = DEFAULT_REFERENCE_HEADER
    one_shot: bool = False
    example_header: str = DEFAULT_EXAMPLE_HEADER
    example: str = DEFAULT_EXAMPLE
    fix_instruction: str = DEFAULT_FIX_INSTRUCTION
    faster_instruction: str = DEFAULT_FASTER_INSTRUCTION
    no_code_feedback: str = DEFAULT_NO_CODE_FEEDBACK
    eval_refused: str = "The evaluator refused the candidate: {error}"  # a 4xx from the eval server
    max_feedback_chars: int = 4000  # evaluator feedback longer than this keeps its head and tail


def _fence(source: str) -> str:
    return f"```python\n{source.strip(chr(10))}\n```"


def build_messages(reference: str, config: PromptConfig | None = None) -> list[dict[str, str]]:
    """System (optional) + first user message for a KernelBench-format reference source."""
    config = config or PromptConfig()
    parts = [config.instructions]
    if config.one_shot:
        parts.append(f"{config.example_header}\n\n{_fence(config.example)}")
    parts.append(f"{config.reference_header}\n\n{_fence(reference)}")
    messages: list[dict[str, str]] = []
    if config.system:
        messages.append({"role": "system", "content": config.system})
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages


def _trim(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters omitted ...]\n{text[-tail:]}"


def feedback_text(result: EvalResult, config: PromptConfig | None = None) -> str:
    """Content of the user message that follows an evaluated turn."""
    config = config or PromptConfig()
    body = result.feedback.strip() or f"Evaluation status: {result.status}."
    instruction = config.faster_instruction if result.correct else config.fix_instruction
    return f"{_trim(body, config.max_feedback_chars)}\n\n{instruction}"


def feedback_message(result: EvalResult, config: PromptConfig | None = None) -> dict[str, str]:
    return {"role": "user", "content": feedback_text(result, config)}


def no_code_feedback(config: PromptConfig | None = None) -> dict[str, str]:
    config = config or PromptConfig()
    return {"role": "user", "content": config.no_code_feedback}


def refused_feedback(error: str, config: PromptConfig | None = None) -> dict[str, str]:
    """The next user turn when the eval server refused the request (e.g. candidate too long)."""
    config = config or PromptConfig()
    text = _trim(config.eval_refused.format(error=error), config.max_feedback_chars)
    return {"role": "user", "content": f"{text}\n\n{config.fix_instruction}"}
