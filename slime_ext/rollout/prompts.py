"""Prompt and feedback messages for the kernel-writing task (every template lives here).

A prompt is a list of chat messages (`{"role", "content"}`), rendered later with the model's own
chat template (`slime_ext/rollout/chat.py`). `PromptConfig` holds every template, so a run can change the
wording from a config file without touching code; the defaults are the recipe's wording for
Triton, and `default_prompt("cuda")` the wording for CUDA C++ (its own system message, rules and
one-shot example: a ReLU built with `load_inline`).

- `build_messages(reference, config)`: system message + the first user message (the reference
  module, the rules for `ModelNew`, the output format, optionally a one-shot ReLU example in the backend's language).
- `feedback_message(result, config)`: the next user turn after an evaluation: the evaluator's
  `feedback` text plus a short instruction (fix it, or make it faster), asking again for the
  whole module in one fenced python block.
- `no_code_feedback(config)`: the next user turn when the response had no fenced python block.
- `refused_feedback(error, config)`: the next user turn when the eval server refused the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eval_server.schema import EVALUATOR_STATUSES, EvalResult
from slime_ext.clients.backends import CUDA, TRITON, check_backend
from slime_ext.rollout.roles import FIXER, GENERATOR, OPTIMIZER, ROLES, RolePrompt, role_after

__all__ = [
    "CUDA_EXAMPLE",
    "DEFAULT_EXAMPLE",
    "PromptConfig",
    "build_messages",
    "default_prompt",
    "feedback_message",
    "feedback_text",
    "no_code_feedback",
    "refused_feedback",
]

_SYSTEM = "You are an expert GPU programmer. You rewrite PyTorch modules as fast, correct {language} kernels."


def _instructions(kernel_rule: str, imports: str, parts: str) -> str:
    """The first user message's rules; only the kernel rule and the imports differ per backend."""
    return f"""\
Write `class ModelNew(nn.Module)` that replaces `Model` below.

Rules:
- `ModelNew` has the same constructor arguments and the same `forward` signature as `Model`, and returns the same outputs (same shapes and dtypes, numerically equal within tolerance).
- {kernel_rule}
- Do not copy, subclass or call `Model`, and do not fall back to PyTorch in a try/except.
- Import everything you use ({imports}).
- Make it fast: the speed of your `ModelNew` is compared with the reference.

Return the whole module ({parts} and `ModelNew`) in ONE fenced ```python code block."""


DEFAULT_SYSTEM = _SYSTEM.format(language="Triton")

DEFAULT_INSTRUCTIONS = _instructions(
    "`forward` must launch one or more `@triton.jit` kernels that do all of the math. Do not call torch "
    "operators (torch.matmul, torch.relu, F.*, tensor arithmetic, ...) to compute the result; allocating "
    "outputs (torch.empty, torch.empty_like) and reshaping views are fine.",
    "torch, torch.nn as nn, triton, triton.language as tl",
    "imports, kernels",
)

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

CUDA_SYSTEM = _SYSTEM.format(language="CUDA C++")

CUDA_INSTRUCTIONS = _instructions(
    "Write the kernels in CUDA C++ (`__global__` functions and the C++ functions that launch them) as "
    "strings in the Python file, compile them with `torch.utils.cpp_extension.load_inline`, and call the "
    "compiled functions from `forward`; they must do all of the math. Do not compute the result with torch "
    "operators in Python (torch.matmul, F.*, tensor arithmetic, ...) or with ATen, cuBLAS or cuDNN calls in "
    "C++ (at::matmul, torch::conv2d, ...); allocating outputs (torch::empty, torch.empty_like) and reshaping "
    "views are fine. Launch on the current stream (at::cuda::getCurrentCUDAStream()).",
    "torch, torch.nn as nn, load_inline from torch.utils.cpp_extension",
    "imports, CUDA source strings, the load_inline call",
)

# Written for this project; tests/gpu/test_cuda_prompt_gpu.py builds and checks it on a GPU.
CUDA_EXAMPLE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "relu_forward: float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    int64_t n = xc.numel();
    if (n == 0) {
        return out;
    }
    const int threads = 256;
    const unsigned int blocks = (unsigned int)((n + threads - 1) / threads);
    relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

relu_cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"

relu_module = load_inline(
    name="relu_example",
    cpp_sources=relu_cpp_source,
    cuda_sources=relu_cuda_source,
    functions=["relu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_module.relu_forward(x)'''

DEFAULT_FIX_INSTRUCTION = (
    "Fix the problem above and return the full corrected module again, in ONE fenced ```python block."
)
# after an evaluator-side status (reference_error, server_error, unsupported): nothing to fix
DEFAULT_RESUBMIT_INSTRUCTION = (
    "The evaluator could not judge this answer, through no fault of yours. Return the full module "
    "again, in ONE fenced ```python block."
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
    resubmit_instruction: str = DEFAULT_RESUBMIT_INSTRUCTION
    no_code_feedback: str = DEFAULT_NO_CODE_FEEDBACK
    eval_refused: str = "The evaluator refused the candidate: {error}"  # a 4xx from the eval server
    max_feedback_chars: int = 4000  # evaluator feedback longer than this keeps its head and tail
    # per-role wording (roles.py: generator, fixer, optimizer); a role not named keeps the above.
    # Given as a mapping, kept as sorted (role, RolePrompt) pairs (the config stays hashable).
    roles: Mapping[str, RolePrompt] | tuple[tuple[str, RolePrompt], ...] = ()

    def __post_init__(self) -> None:
        pairs = dict(self.roles.items() if isinstance(self.roles, Mapping) else self.roles)
        unknown = sorted(set(pairs) - set(ROLES))
        if unknown:
            raise ValueError(f"prompt.roles: unknown role(s) {unknown}; the roles are {list(ROLES)}")
        object.__setattr__(self, "roles", tuple(sorted(pairs.items())))

    def role(self, name: str) -> RolePrompt:
        return dict(self.roles).get(name) or RolePrompt()  # type: ignore[arg-type]


def default_prompt(backend: str = TRITON) -> PromptConfig:
    """The recipe's wording for a kernel backend: Triton's defaults, or the CUDA system message,
    rules and one-shot example (the feedback turns are the same for both)."""
    backend = check_backend(backend)
    if backend == CUDA:
        return PromptConfig(system=CUDA_SYSTEM, instructions=CUDA_INSTRUCTIONS, example=CUDA_EXAMPLE)
    return PromptConfig()


def _fence(source: str) -> str:
    return f"```python\n{source.strip(chr(10))}\n```"


def build_messages(reference: str, config: PromptConfig | None = None) -> list[dict[str, str]]:
    """System (optional) + first user message for a KernelBench-format reference source."""
    config = config or PromptConfig()
    generator = config.role(GENERATOR)
    parts = [p for p in (generator.preamble, config.instructions) if p]
    if config.one_shot:
        parts.append(f"{config.example_header}\n\n{_fence(config.example)}")
    parts.append(f"{config.reference_header}\n\n{_fence(reference)}")
    if generator.instruction:
        parts.append(generator.instruction)
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


def _handover(config: PromptConfig, role: str, body: str, default_instruction: str | None) -> str:
    """The user message that hands the next turn to `role`: its preamble, the body, its closing
    instruction (the role's, else `default_instruction`; None: none)."""
    wording = config.role(role)
    instruction = wording.instruction or default_instruction
    parts = [wording.preamble, body, instruction]
    return "\n\n".join(p for p in parts if p)


def feedback_text(result: EvalResult, config: PromptConfig | None = None) -> str:
    """Content of the user message that follows an evaluated turn (to the optimizer when the
    kernel was correct, else to the fixer)."""
    config = config or PromptConfig()
    body = _trim(result.feedback.strip() or f"Evaluation status: {result.status}.", config.max_feedback_chars)
    role = role_after(result)
    if result.status in EVALUATOR_STATUSES:
        default = config.resubmit_instruction
    else:
        default = config.faster_instruction if role == OPTIMIZER else config.fix_instruction
    return _handover(config, role, body, default)


def feedback_message(result: EvalResult, config: PromptConfig | None = None) -> dict[str, str]:
    return {"role": "user", "content": feedback_text(result, config)}


def no_code_feedback(config: PromptConfig | None = None) -> dict[str, str]:
    """The next user turn (to the fixer) when the answer had no code block."""
    config = config or PromptConfig()
    return {"role": "user", "content": _handover(config, FIXER, config.no_code_feedback, None)}


def refused_feedback(error: str, config: PromptConfig | None = None) -> dict[str, str]:
    """The next user turn (to the fixer) when the eval server refused the request (e.g. candidate too long)."""
    config = config or PromptConfig()
    text = _trim(config.eval_refused.format(error=error), config.max_feedback_chars)
    return {"role": "user", "content": _handover(config, FIXER, text, config.fix_instruction)}
