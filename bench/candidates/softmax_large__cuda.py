"""Softmax over the last dim of a 2-D fp32 input (KernelBench L1 23: 4096 x 393216), CUDA format.

One block per row; rows can be far longer than a block (393216 floats = 1.5 MB), so each thread
walks the row with a block-wide stride in two passes:
1. an online max/sum: each thread keeps a running max m and the sum s of exp(x - m), rescaling s
   when m grows; the (m, s) pairs are merged across the warp with shuffles, then across warps in
   shared memory. Nothing is exponentiated above its row max, so it is numerically stable;
2. out = exp(x - m) / s, written once.
Two reads and one write per element, all in fp32 with expf (no fast-math intrinsics). float4
accesses when the row length is a multiple of 4 and the pointers are 16-byte aligned.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_cuda_source = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>
#include <math_constants.h>

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;

// Add one element to a running (max, sum of exp(x - max)).
__device__ __forceinline__ void ms_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else if (m != -CUDART_INF_F) {
        s += expf(x - m);
    }
}

// Merge another running (max, sum) into (m, s).
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else if (m2 != -CUDART_INF_F) {
        s += s2 * expf(m2 - m);
    }
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS) softmax_row_kernel(const float* __restrict__ x,
                                                              float* __restrict__ out, int64_t cols) {
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* out_row = out + (int64_t)blockIdx.x * cols;
    float m = -CUDART_INF_F, s = 0.0f;

    // Pass 1: per-thread online max and sum.
    if (VEC) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < cols / 4; i += THREADS) {
            float4 v = row4[i];
            ms_add(m, s, v.x);
            ms_add(m, s, v.y);
            ms_add(m, s, v.z);
            ms_add(m, s, v.w);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += THREADS) ms_add(m, s, row[i]);
    }

    // Block-wide merge: warps with shuffles, then warp 0 over the per-warp results.
    __shared__ float sm_m[WARPS], sm_s[WARPS];
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_down_sync(0xffffffffu, m, offset);
        float s2 = __shfl_down_sync(0xffffffffu, s, offset);
        ms_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        sm_m[warp] = m;
        sm_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < WARPS ? sm_m[lane] : -CUDART_INF_F;
        s = lane < WARPS ? sm_s[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) {
            float m2 = __shfl_down_sync(0xffffffffu, m, offset);
            float s2 = __shfl_down_sync(0xffffffffu, s, offset);
            ms_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            sm_m[0] = m;
            sm_s[0] = s;
        }
    }
    __syncthreads();
    const float row_max = sm_m[0];
    const float inv_sum = 1.0f / sm_s[0];

    // Pass 2: normalize and write.
    if (VEC) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        float4* out4 = reinterpret_cast<float4*>(out_row);
        for (int64_t i = threadIdx.x; i < cols / 4; i += THREADS) {
            float4 v = row4[i];
            v.x = expf(v.x - row_max) * inv_sum;
            v.y = expf(v.y - row_max) * inv_sum;
            v.z = expf(v.z - row_max) * inv_sum;
            v.w = expf(v.w - row_max) * inv_sum;
            out4[i] = v;
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += THREADS) out_row[i] = expf(row[i] - row_max) * inv_sum;
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "expected a 2-D input (softmax over dim 1)");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    if (rows == 0 || cols == 0) return out;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid");
    const float* src = xc.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (vec) {
        softmax_row_kernel<true><<<(unsigned)rows, THREADS, 0, stream>>>(src, dst, cols);
    } else {
        softmax_row_kernel<false><<<(unsigned)rows, THREADS, 0, stream>>>(src, dst, cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

softmax_cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

softmax_ext = load_inline(
    name="bench_softmax_large_cuda",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_cuda_source,
    functions=["softmax_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_ext.softmax_forward(x)
