"""Swish, x * sigmoid(x), on a small (2048, 1024) fp32 tensor: launch-overhead-dominated (level 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Computes x * sigmoid(x) elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
BATCH = 2048
DIM = 1024


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
