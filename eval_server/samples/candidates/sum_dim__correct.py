"""Correct sum over one dimension with keepdim=True.

The input is viewed as (outer, reduced, inner); each Triton program owns a block of `inner`
columns for one `outer` index and loops over the reduced axis in tiles.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(
    x_ptr,
    out_ptr,
    reduce_size,
    inner_size,
    BLOCK_R: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
):
    outer = tl.program_id(axis=0)
    pid_inner = tl.program_id(axis=1)
    inner = pid_inner * BLOCK_INNER + tl.arange(0, BLOCK_INNER)
    inner_mask = inner < inner_size
    base = x_ptr + outer * reduce_size * inner_size

    acc = tl.zeros((BLOCK_INNER,), dtype=tl.float32)
    for r_start in range(0, reduce_size, BLOCK_R):
        r = r_start + tl.arange(0, BLOCK_R)
        mask = (r[:, None] < reduce_size) & inner_mask[None, :]
        tile = tl.load(base + r[:, None] * inner_size + inner[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile.to(tl.float32), axis=0)

    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + outer * inner_size + inner, out, mask=inner_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer_size = math.prod(x.shape[:dim])
        reduce_size = x.shape[dim]
        inner_size = math.prod(x.shape[dim + 1 :])

        out_shape = list(x.shape)
        out_shape[dim] = 1
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)

        BLOCK_R = min(triton.next_power_of_2(max(reduce_size, 1)), 64)
        BLOCK_INNER = min(triton.next_power_of_2(max(inner_size, 1)), 256)
        grid = (outer_size, triton.cdiv(inner_size, BLOCK_INNER))
        sum_dim_kernel[grid](x, out, reduce_size, inner_size, BLOCK_R=BLOCK_R, BLOCK_INNER=BLOCK_INNER)
        return out
