"""Fused Linear + scale + LeakyReLU: one tiled Triton GEMM with the epilogue in registers.

The parameters live in an nn.Linear built exactly as the reference builds it (same seed, same
weights); forward only reads linear.weight and linear.bias. Each program computes a
BLOCK_M x BLOCK_N tile of x @ W^T with tl.dot (fp32 accumulation), then adds the bias, scales
and applies LeakyReLU before its single store. Programs are ordered in groups of GROUP_M tile
rows so the W^T column panels they share stay in L2. W is stored (N, K) with K contiguous, so
the (BLOCK_K, BLOCK_N) tiles of W^T are K-major, as Hopper's tf32 wgmma wants both operands.

DOT_PRECISION picks the tensor-core mode for fp32 inputs: "tf32x3" (about fp32 accuracy, roughly
3x the MMA work; what the evaluator's default fp32 precision policy accepts), "tf32" (10-bit
mantissa inputs, fp32 accumulation: rejected as lower precision under the fp32 policy) or "ieee"
(no tensor cores, full fp32 products).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

DOT_PRECISION = "tf32x3"
BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32
GROUP_M = 8
NUM_STAGES = 4
NUM_WARPS = 8


@triton.jit
def linear_scale_leakyrelu_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    multiplier,
    negative_slope,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile rows down one tile column before moving right.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # W is stored (N, K); these pointers address a (BLOCK_K, BLOCK_N) tile of W^T.
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_mask = (k_start + offs_k) < K
        a = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    bias = tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    y = (acc + bias[None, :]) * multiplier
    y = tl.where(y >= 0, y, y * negative_slope)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, multiplier: float, negative_slope: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.linear.weight
        bias = self.linear.bias
        leading_shape = x.shape[:-1]
        x2d = x.reshape(-1, x.shape[-1])
        M, K = x2d.shape
        N = weight.shape[0]
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)

        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        linear_scale_leakyrelu_kernel[grid](
            x2d,
            weight,
            bias,
            out,
            M,
            N,
            K,
            x2d.stride(0),
            x2d.stride(1),
            weight.stride(0),
            weight.stride(1),
            out.stride(0),
            out.stride(1),
            float(self.multiplier),
            float(self.negative_slope),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            GROUP_M=GROUP_M,
            INPUT_PRECISION=DOT_PRECISION,
            num_stages=NUM_STAGES,
            num_warps=NUM_WARPS,
        )
        return out.reshape(*leading_shape, N)
