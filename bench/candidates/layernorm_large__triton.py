"""LayerNorm over the trailing normalized dims with elementwise affine, one program per row.

The parameters live in an nn.LayerNorm built as the reference builds it; forward reads its
weight, bias and eps. Statistics are accumulated in fp32 and the variance is the biased one
(mean of squared deviations), as torch computes it; rstd = 1 / sqrt(var + eps).
- Rows of up to MAX_FUSED_COLS elements (the problem's rows are 8192 floats, 32 KB) are held in
  registers: one read, two-pass mean/variance on the registers (no cancellation), one write.
- Longer rows use a looped kernel: pass 1 sums x for the mean, pass 2 sums (x - mean)^2,
  pass 3 normalizes and writes (the rereads mostly hit L1/L2).
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

MAX_FUSED_COLS = 16384
LOOP_BLOCK_COLS = 4096


@triton.jit
def layernorm_row_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)

    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)

    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = diff * rstd * w + b
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_looped_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)

    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        acc += tl.load(x_row + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / n_cols

    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        diff = tl.where(mask, x - mean, 0.0)
        acc += diff * diff
    var = tl.sum(acc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)

    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(block: int) -> int:
    if block <= 1024:
        return 4
    if block <= 8192:
        return 8
    return 16


class ModelNew(nn.Module):
    def __init__(self, normalized_features: int):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = math.prod(self.ln.normalized_shape)
        n_rows = x.numel() // n_cols
        out = torch.empty_like(x)
        if n_rows == 0:
            return out
        weight = self.ln.weight.contiguous()
        bias = self.ln.bias.contiguous()
        eps = float(self.ln.eps)

        if n_cols <= MAX_FUSED_COLS:
            block = triton.next_power_of_2(n_cols)
            layernorm_row_kernel[(n_rows,)](
                x, weight, bias, out, n_cols, eps, BLOCK=block, num_warps=_num_warps(block)
            )
        else:
            block = min(triton.next_power_of_2(n_cols), LOOP_BLOCK_COLS)
            layernorm_looped_kernel[(n_rows,)](
                x, weight, bias, out, n_cols, eps, BLOCK=block, num_warps=_num_warps(block)
            )
        return out
