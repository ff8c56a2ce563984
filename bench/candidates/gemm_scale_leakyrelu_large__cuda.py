"""Fused Linear + multiply + LeakyReLU (KernelBench L2 12: 1024 x 8192 -> 8192), CUDA format.

The parameters live in an nn.Linear built as the reference builds its own (same seed, same
weights); forward passes its weight and bias to one kernel. A plain shared-memory tiled fp32
GEMM, no tensor cores: each 256-thread block computes a 64 x 64 tile of x @ W^T; per 16-wide K
step it stages a 64 x 16 tile of x and of W (both K-contiguous) in shared memory, transposed to
[k][row], and each thread accumulates a 4 x 4 sub-tile with fp32 FMAs (rows ty + 16 i, columns
tx + 16 j, so shared reads and the final stores are consecutive across a warp's threads). The
epilogue adds the bias, multiplies and applies LeakyReLU in registers before the single store.
fp32 products and accumulation throughout, so it passes the fp32 precision policy.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gemm_cuda_source = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

constexpr int BM = 64, BN = 64, BK = 16;
constexpr int TPR = 16;            // threads per tile row and column: a 16 x 16 block
constexpr int TM = BM / TPR, TN = BN / TPR;
constexpr int THREADS = TPR * TPR;

__global__ void __launch_bounds__(THREADS) gemm_scale_leakyrelu_kernel(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
    float* __restrict__ out, int64_t M, int64_t N, int64_t K, float multiplier, float negative_slope) {
    __shared__ float xs[BK][BM + 1];
    __shared__ float ws[BK][BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid % TPR, ty = tid / TPR;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        // Stage x[m0:m0+64, k0:k0+16] and w[n0:n0+64, k0:k0+16]: 1024 elements each, 4 per thread.
        #pragma unroll
        for (int e = 0; e < (BM * BK) / THREADS; ++e) {
            const int idx = tid + e * THREADS;
            const int r = idx / BK, c = idx % BK;
            const int64_t k = k0 + c;
            const int64_t gm = m0 + r, gn = n0 + r;
            xs[c][r] = (gm < M && k < K) ? x[gm * K + k] : 0.0f;
            ws[c][r] = (gn < N && k < K) ? w[gn * K + k] : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int c = 0; c < BK; ++c) {
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = xs[c][ty + TPR * i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = ws[c][tx + TPR * j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int64_t gm = m0 + ty + TPR * i;
        if (gm >= M) continue;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int64_t gn = n0 + tx + TPR * j;
            if (gn >= N) continue;
            float v = (acc[i][j] + bias[gn]) * multiplier;
            out[gm * N + gn] = v >= 0.0f ? v : v * negative_slope;
        }
    }
}

torch::Tensor gemm_scale_leakyrelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                           double multiplier, double negative_slope) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "expected CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                    bias.scalar_type() == torch::kFloat32, "expected float32 tensors");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1, "expected x (M, K), weight (N, K), bias (N)");
    TORCH_CHECK(x.size(1) == weight.size(1) && bias.size(0) == weight.size(0), "shape mismatch");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    if (M == 0 || N == 0) return out;
    TORCH_CHECK((M + BM - 1) / BM <= 65535, "batch too large for the grid's y dimension");
    dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM));
    gemm_scale_leakyrelu_kernel<<<grid, THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), M, N, K,
        (float)multiplier, (float)negative_slope);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

gemm_cpp_source = (
    "torch::Tensor gemm_scale_leakyrelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
    "double multiplier, double negative_slope);"
)

gemm_ext = load_inline(
    name="bench_gemm_scale_leakyrelu_large_cuda",
    cpp_sources=gemm_cpp_source,
    cuda_sources=gemm_cuda_source,
    functions=["gemm_scale_leakyrelu_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, multiplier: float, negative_slope: float):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading_shape = x.shape[:-1]
        out = gemm_ext.gemm_scale_leakyrelu_forward(
            x.reshape(-1, x.shape[-1]),
            self.gemm.weight,
            self.gemm.bias,
            float(self.multiplier),
            float(self.negative_slope),
        )
        return out.reshape(*leading_shape, out.shape[-1])
