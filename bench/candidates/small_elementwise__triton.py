"""Swish, x * sigmoid(x): one elementwise Triton kernel over the flattened input.

sigmoid is written as 1 / (1 + exp(-x)) in fp32 (no libdevice), so it also runs in the Triton
interpreter. The tensor is small (2M elements), so this kernel mostly measures launch overhead;
1024-element blocks with 4 warps give 2048 programs, enough to fill every SM.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_SIZE = 1024
NUM_WARPS = 4


@triton.jit
def swish_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    y = xf * (1.0 / (1.0 + tl.exp(-xf)))
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        swish_kernel[grid](x, out, n_elements, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
        return out
