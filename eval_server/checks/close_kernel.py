"""compare.py's closeness statistics in one fused Triton pass, for float outputs on a GPU.

Why: the torch version takes ~10 elementwise passes with temporaries per chunk; on KernelBench's
1.6 G-element outputs (L1_19 ReLU, L1_23 Softmax) that was ~0.1 s per comparison and ~0.5 s of
every evaluation (six comparisons: five correctness trials and the timed output's check). This
kernel reads each element of both tensors once. Same rule as compare._close_stats with
`mask_same` (equal values, equal infinities and NaN in both are no difference), in float32 math.

The kernel is bound when compare.py is imported, before any candidate code runs, and
runtime_checks' namespace snapshot covers this module and triton.JITFunction.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Output dtypes it handles (upcast to float32 in registers, as the torch path does in memory).
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BLOCK = 4096


@triton.jit
def _close_partials(ref_ptr, cand_ptr, n, tol, out_ptr, BLOCK: tl.constexpr):
    """Per block: [max finite |c - r|, max finite relative diff, any outside tol, any non-finite]."""
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    r = tl.load(ref_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cand_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    same = (c == r) | ((c != c) & (r != r))
    diff = tl.where(same, 0.0, tl.abs(c - r))
    finite = diff < float("inf")  # False for NaN too
    diff = tl.where(finite, diff, 0.0)
    mag = tl.abs(r)
    outside = finite & (diff > mag * tol + tol)
    rel = tl.where(finite & (mag > tol), tl.div_rn(diff, mag), 0.0)  # IEEE division, as torch
    base = out_ptr + pid * 4
    tl.store(base, tl.max(diff, axis=0))
    tl.store(base + 1, tl.max(rel, axis=0))
    tl.store(base + 2, tl.max(outside.to(tl.float32), axis=0))
    tl.store(base + 3, tl.max((~finite).to(tl.float32), axis=0))


def handles(ref: torch.Tensor, cand: torch.Tensor) -> bool:
    """Whether close_stats applies: same float dtype (fp32/fp16/bf16), non-empty, same device
    (compare.py takes it on CUDA devices; tests also run it under TRITON_INTERPRET)."""
    return ref.dtype == cand.dtype and ref.dtype in DTYPES and ref.numel() > 0 and ref.device == cand.device


def close_stats(ref: torch.Tensor, cand: torch.Tensor, tol: float) -> tuple[bool, float, float]:
    """(every element within tolerance, max abs diff, max rel diff), as compare._torch_close;
    (False, inf, inf) when a difference is not finite. One host sync."""
    r = ref.detach().reshape(-1)
    c = cand.detach().reshape(-1)
    n = r.numel()
    blocks = triton.cdiv(n, _BLOCK)
    partials = torch.empty((blocks, 4), dtype=torch.float32, device=r.device)
    _close_partials[(blocks,)](r, c, n, float(tol), partials, BLOCK=_BLOCK, num_warps=8)
    max_abs, max_rel, outside, nonfinite = partials.amax(dim=0).tolist()
    if nonfinite:
        return False, math.inf, math.inf
    return outside == 0.0, max_abs, max_rel
