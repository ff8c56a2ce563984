"""Row softmax for rows too long for one block: one program per row, two passes over tiles.

Pass 1 is an online softmax: each lane of a BLOCK-wide vector keeps its own running max `m` and
running sum `s` of exp(x - m), rescaling `s` when its max grows, so a pass needs no cross-thread
reduction per tile; the lanes are combined once at the end into the row max and denominator.
Pass 2 re-reads the row and writes exp(x - max) / sum. The row is read twice and written once
(the minimum for rows that do not fit on chip: a 65536-float row is 256 KB).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

MAX_BLOCK_COLS = 4096  # column tile width; shorter rows use the next power of two
NUM_WARPS = 8


@triton.jit
def softmax_looped_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    cols = tl.arange(0, BLOCK)

    m = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has only seen -inf (masked tail) keeps s == 0; shift by 0 to avoid inf - inf.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new

    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)
    inv_sum = 1.0 / row_sum

    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - row_max) * inv_sum
        tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2, f"expected a 2-D input, got shape {tuple(x.shape)}"
        x = x.contiguous()
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        block = min(triton.next_power_of_2(max(n_cols, 1)), MAX_BLOCK_COLS)
        softmax_looped_kernel[(n_rows,)](
            x, out, n_cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=NUM_WARPS
        )
        return out
