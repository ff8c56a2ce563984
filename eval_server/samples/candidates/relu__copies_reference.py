"""Rejected: copies the reference Model and subclasses it, so ModelNew is the reference itself.

Demonstrates status `rejected` (ModelNew inherits the PyTorch forward; no Triton code runs).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


class Model(nn.Module):
    """Applies ReLU to every element of the input."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class ModelNew(Model):
    pass
