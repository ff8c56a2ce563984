"""Sum over one dimension with keepdim=True (KernelBench L1 47: dim 1 of 128 x 4096 x 4095), CUDA format.

The contiguous input is viewed as (outer, reduce, inner); the output (outer, inner) is returned
with the reduced dimension kept as size 1. A block of 32 x 8 threads owns 32 contiguous `inner`
columns of one `outer` slab: each of the 8 thread rows sums every 8th reduced row in fp32
(a warp reads 32 consecutive floats per row, coalesced; every input element is read once), then
the 8 partial sums of a column are added in shared memory. Correct for any dim, but tuned for
inner > 1: reducing the last dim (inner == 1) leaves 31 of 32 lanes idle.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_cuda_source = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>
#include <vector>

constexpr int COLS = 32;  // inner columns per block (threadIdx.x)
constexpr int ROWS = 8;   // reduced rows walked in parallel (threadIdx.y)

__global__ void __launch_bounds__(COLS * ROWS) sum_dim_kernel(const float* __restrict__ x, float* __restrict__ out,
                                                           int64_t reduce, int64_t inner, int64_t col_tiles) {
    const int64_t o = (int64_t)blockIdx.x / col_tiles;
    const int64_t col = ((int64_t)blockIdx.x % col_tiles) * COLS + threadIdx.x;
    float acc = 0.0f;
    if (col < inner) {
        const float* p = x + o * reduce * inner + col;
        #pragma unroll 4
        for (int64_t r = threadIdx.y; r < reduce; r += ROWS) acc += p[r * inner];
    }
    __shared__ float partial[ROWS][COLS + 1];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
        float total = 0.0f;
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) total += partial[r][threadIdx.x];
        out[o * inner + col] = total;
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected a float32 CUDA tensor");
    TORCH_CHECK(x.dim() > 0, "expected at least one dimension");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    auto xc = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    const int64_t reduce = xc.size(dim);
    std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
    shape[dim] = 1;
    auto out = torch::empty(shape, xc.options());
    if (outer * inner == 0) return out;
    const int64_t col_tiles = (inner + COLS - 1) / COLS;
    const int64_t blocks = outer * col_tiles;
    TORCH_CHECK(blocks <= 2147483647LL, "too many blocks for a 1-D grid");
    // reduce == 0 gives zeros: every thread adds nothing and writes its 0.
    sum_dim_kernel<<<(unsigned)blocks, dim3(COLS, ROWS), 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), reduce, inner, col_tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

sum_cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="bench_sum_dim_large_cuda",
    cpp_sources=sum_cpp_source,
    cuda_sources=sum_cuda_source,
    functions=["sum_dim_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_forward(x, self.dim)
