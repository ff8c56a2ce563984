"""The kernel languages a run can train (one recipe setting, `kernel_rl.episode.backend`).

- `triton` (default): the candidate's `ModelNew.forward` launches `@triton.jit` kernels.
- `cuda`: KernelBench's CUDA format: CUDA C++ source inside the Python file, compiled with
  `torch.utils.cpp_extension.load_inline`, the compiled functions called from `forward`.

The name travels everywhere the language matters: the prompts (`slime_ext/rollout/prompts.py`), the eval
request's `options.backend`, the evaluation reports and the data tools.
"""

from __future__ import annotations

from typing import Any

from eval_server.schema import BACKENDS, EvalOptions
from krl_common.validation import ValidationError

__all__ = ["BACKENDS", "CUDA", "DEFAULT_BACKEND", "TRITON", "check_backend"]

TRITON, CUDA = BACKENDS  # the eval server's list is the one definition
DEFAULT_BACKEND = EvalOptions.backend


def check_backend(value: Any, path: str = "backend") -> str:
    """`value` when it names a backend; else a ValidationError naming `path` and the choices."""
    if not isinstance(value, str) or value not in BACKENDS:
        raise ValidationError(
            f"{path}: unknown kernel backend {value!r}; choose one of {', '.join(BACKENDS)}"
        )
    return value
