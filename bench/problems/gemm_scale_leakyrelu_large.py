"""Linear(8192 -> 8192) on a batch of 1024, times a scalar, then LeakyReLU (level 2)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Computes leaky_relu((x @ W^T + b) * multiplier, negative_slope)."""

    def __init__(self, in_features: int, out_features: int, multiplier: float, negative_slope: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = x * self.multiplier
        return F.leaky_relu(x, negative_slope=self.negative_slope)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
# Lower-case values are semantic and never shrunk.
BATCH = 1024
IN_FEATURES = 8192
OUT_FEATURES = 8192
multiplier = 2.0
negative_slope = 0.1


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, multiplier, negative_slope]
