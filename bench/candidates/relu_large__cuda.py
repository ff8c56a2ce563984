"""ReLU in KernelBench's CUDA format: one streaming elementwise kernel, built with load_inline.

Memory-bound (one read, one write per element). When input and output are 16-byte aligned the
kernel moves float4s (128-bit loads and stores); the last n % 4 elements, or every element of a
misaligned view, go through the scalar kernel. Indices are int64 (4096 x 393216 is past 2**31
elements). `x < 0 ? 0 : x` keeps NaN as NaN, as torch.relu does (fmaxf would turn it into 0).
Launched on torch's current stream.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cuda_source = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

__device__ __forceinline__ float relu_one(float v) { return v < 0.0f ? 0.0f : v; }

__global__ void relu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ out, int64_t n4) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x[i];
        v.x = relu_one(v.x);
        v.y = relu_one(v.y);
        v.z = relu_one(v.z);
        v.w = relu_one(v.w);
        out[i] = v;
    }
}

__global__ void relu_scalar_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t start,
                                   int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = relu_one(x[i]);
    }
}

static int64_t grid_for(int64_t items, int threads) {
    int device = 0, sms = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int64_t blocks = (items + threads - 1) / threads;
    int64_t cap = (int64_t)sms * 16;  // grid-stride beyond 16 blocks of 256 threads per SM
    return blocks < cap ? blocks : cap;
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return out;
    const float* src = xc.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const bool aligned = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
    const int64_t n4 = aligned ? n / 4 : 0;
    const int threads = 256;
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (n4 > 0) {
        relu_vec4_kernel<<<(unsigned)grid_for(n4, threads), threads, 0, stream>>>(
            reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(dst), n4);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (4 * n4 < n) {
        relu_scalar_kernel<<<(unsigned)grid_for(n - 4 * n4, threads), threads, 0, stream>>>(src, dst, 4 * n4, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
"""

relu_cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"

relu_ext = load_inline(
    name="bench_relu_large_cuda",
    cpp_sources=relu_cpp_source,
    cuda_sources=relu_cuda_source,
    functions=["relu_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu_forward(x)
