"""Elementwise ReLU on a 6.4 GB fp32 tensor (memory-bound; KernelBench level-1 style)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies ReLU to every element of the input."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
BATCH = 4096
DIM = 393216


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
