"""Sum reduction over one dimension, keeping the reduced dimension."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Sums the input over dimension `dim` with keepdim=True."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 16
dim1 = 64
dim2 = 32
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
