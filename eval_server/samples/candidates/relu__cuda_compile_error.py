"""Compile error in KernelBench's CUDA format (backend "cuda"): the kernel reads an undeclared
variable, so nvcc fails and its error (with the line of the CUDA source) is the feedback."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cuda_source = r"""
__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(y[i], 0.0f);
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

relu_ext = load_inline(
    name="sample_relu_cuda_broken",
    cpp_sources="torch::Tensor relu_forward(torch::Tensor x);",
    cuda_sources=relu_cuda_source,
    functions=["relu_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu_forward(x)
