"""Statuses of candidates that fail while running, over real HTTP on a CPU eval server.

A candidate whose kernels launched and then hit a device fault must be `runtime_error` (it
compiled), also when the fault reaches the evaluator wrapped in a Triton compile-named
exception, as a later kernel's first launch in a poisoned CUDA context produces. A real
compile failure stays `compile_error`.
"""

from __future__ import annotations

import httpx
import pytest

from eval_server import samples

pytestmark = pytest.mark.integration

KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl
{extra_import}

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        {after_launch}
        return out
"""


def _eval(url: str, candidate: str) -> dict:
    payload = {
        "reference": samples.load_problem("relu"),
        "candidate": candidate,
        "options": {"correctness_trials": 1},
    }
    resp = httpx.post(f"{url}/eval", json=payload, timeout=180.0)
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


ILLEGAL = "CUDA error: an illegal memory access was encountered"
WRAPPED = "from RuntimeError('Triton Error [CUDA]: an illegal memory access was encountered')"
COMPILATION_ERROR = "from triton.compiler.errors import CompilationError"


@pytest.mark.parametrize(
    "extra_import, after_launch, status",
    [
        pytest.param("", f"raise RuntimeError({ILLEGAL!r})", "runtime_error", id="cuda_fault_after_launch"),
        # The reported bug: a compile-named Triton exception carrying a device fault was compile_error.
        pytest.param(
            COMPILATION_ERROR,
            f"raise CompilationError(None, None, 'load failed') {WRAPPED}",
            "runtime_error",
            id="fault_wrapped_in_compilation_error",
        ),
        pytest.param(
            COMPILATION_ERROR,
            "raise CompilationError(None, None, 'unsupported AST node type: Try')",
            "compile_error",
            id="triton_compile_failure",
        ),
    ],
)
def test_status_of_an_exception_raised_in_forward(
    cpu_server: str, extra_import: str, after_launch: str, status: str
) -> None:
    body = _eval(cpu_server, KERNEL.format(extra_import=extra_import, after_launch=after_launch))
    assert body["status"] == status, body["feedback"][:400]
    assert body["compiled"] is (status != "compile_error")
    assert body["error"]["type"] in ("RuntimeError", "CompilationError")
