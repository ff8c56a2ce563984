"""Softmax over dim=1 of a (4096, 65536) fp32 tensor: rows too long for one block (level 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies softmax over the columns of a 2-D input."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
BATCH = 4096
DIM = 65536


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
