"""Elementwise ReLU."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies ReLU to every element of the input."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 32
dim = 512


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
