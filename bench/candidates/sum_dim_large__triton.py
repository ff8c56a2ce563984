"""Sum over one dimension with keepdim=True, for any reduce dim.

The contiguous input is viewed as (outer, reduce, inner):
- inner > 1 (e.g. dim=1 of (128, 4096, 4096)): each program owns BLOCK_INNER contiguous
  columns of one `outer` slab and walks the reduced axis in BLOCK_R-row tiles, adding whole
  tiles into a 2-D fp32 accumulator; the single cross-row reduction happens once at the end.
  Loads are coalesced along `inner` and every element is read exactly once.
- inner == 1 (reducing the last dim): each program reduces one contiguous row in BLOCK_COLS
  tiles with a 1-D fp32 accumulator.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_R = 32
BLOCK_INNER = 256
BLOCK_COLS = 2048
NUM_WARPS = 8


@triton.jit
def sum_middle_kernel(
    x_ptr,
    out_ptr,
    reduce_size,
    inner_size,
    n_inner_blocks,
    BLOCK_R: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
):
    # 1-D grid (no 65535 limit on any axis); neighbouring programs read neighbouring columns.
    pid = tl.program_id(axis=0)
    outer = pid // n_inner_blocks
    pid_inner = pid % n_inner_blocks
    inner = pid_inner * BLOCK_INNER + tl.arange(0, BLOCK_INNER)
    inner_mask = inner < inner_size
    rows = tl.arange(0, BLOCK_R)
    slab = x_ptr + outer.to(tl.int64) * reduce_size * inner_size
    ptrs = slab + rows[:, None] * inner_size + inner[None, :]

    acc = tl.zeros((BLOCK_R, BLOCK_INNER), dtype=tl.float32)
    for r_start in range(0, reduce_size, BLOCK_R):
        mask = ((r_start + rows)[:, None] < reduce_size) & inner_mask[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        ptrs += BLOCK_R * inner_size

    total = tl.sum(acc, axis=0)
    out_offs = outer.to(tl.int64) * inner_size + inner
    tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=inner_mask)


@triton.jit
def sum_last_kernel(x_ptr, out_ptr, reduce_size, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * reduce_size
    cols = tl.arange(0, BLOCK_COLS)

    acc = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
    for start in range(0, reduce_size, BLOCK_COLS):
        offs = start + cols
        acc += tl.load(x_row + offs, mask=offs < reduce_size, other=0.0).to(tl.float32)

    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


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
        if out.numel() == 0:
            return out

        if inner_size == 1:
            block_cols = min(triton.next_power_of_2(max(reduce_size, 1)), BLOCK_COLS)
            sum_last_kernel[(outer_size,)](x, out, reduce_size, BLOCK_COLS=block_cols, num_warps=NUM_WARPS)
        else:
            block_inner = min(triton.next_power_of_2(inner_size), BLOCK_INNER)
            block_r = min(triton.next_power_of_2(max(reduce_size, 1)), BLOCK_R)
            n_inner_blocks = triton.cdiv(inner_size, block_inner)
            sum_middle_kernel[(outer_size * n_inner_blocks,)](
                x,
                out,
                reduce_size,
                inner_size,
                n_inner_blocks,
                BLOCK_R=block_r,
                BLOCK_INNER=block_inner,
                num_warps=NUM_WARPS,
            )
        return out
