"""Correct fused Linear + scale + LeakyReLU in a single Triton kernel.

The parameters live in an nn.Linear created exactly as the reference creates it (so the same
seed gives the same weights); forward only reads linear.weight and linear.bias and never calls
the module. The kernel computes x @ W^T with tl.dot, then adds the bias, scales and applies
LeakyReLU in registers before the single store.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


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
):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k = k_start + offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
            mask=(offs_m[:, None] < M) & (k[None, :] < K),
            other=0.0,
        )
        # W is stored (N, K); load a (BLOCK_K, BLOCK_N) tile of W^T.
        w_t = tl.load(
            w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
            mask=(k[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(x, w_t, input_precision="ieee")

    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc + bias[None, :]) * multiplier
    y = tl.where(y >= 0, y, y * negative_slope)

    tl.store(
        out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
        y.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


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

        BLOCK_M, BLOCK_N, BLOCK_K = 32, 64, 32
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
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
        )
        return out.reshape(*leading_shape, N)
