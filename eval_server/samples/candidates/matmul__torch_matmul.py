"""Rejected: launches a token Triton kernel (a copy of A) but computes the product with torch.matmul.

Demonstrates status `rejected`: a kernel ran, yet the math was done by a PyTorch operator.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        A = A.contiguous()
        A_copy = torch.empty_like(A)
        n_elements = A.numel()
        BLOCK_SIZE = 4096
        copy_kernel[(triton.cdiv(n_elements, BLOCK_SIZE),)](A, A_copy, n_elements, BLOCK_SIZE=BLOCK_SIZE)
        return torch.matmul(A_copy, B)
