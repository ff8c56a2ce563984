"""Sum over dim=1 (keepdim) of a (128, 4096, 4096) fp32 tensor, 8.6 GB read (level 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Sums the input over dimension `dim` with keepdim=True."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
# Lower-case values are semantic and never shrunk.
BATCH = 128
DIM1 = 4096
DIM2 = 4096
reduce_dim = 1


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [reduce_dim]
