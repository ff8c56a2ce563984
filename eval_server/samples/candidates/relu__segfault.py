"""Crashed: forward launches the kernel, then segfaults (faulthandler's test helper reads NULL).

Demonstrates status `crashed` (the evaluation process dies with SIGSEGV).
"""

import faulthandler

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
        n_elements = x.numel()
        BLOCK_SIZE = 4096
        relu_kernel[(triton.cdiv(n_elements, BLOCK_SIZE),)](x, out, n_elements, BLOCK_SIZE=BLOCK_SIZE)
        faulthandler._sigsegv()  # SIGSEGV, as a kernel bug in native code would cause
        return out
