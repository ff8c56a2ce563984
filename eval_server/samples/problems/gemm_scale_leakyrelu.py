"""Linear layer, then multiplication by a scalar, then LeakyReLU."""

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


batch_size = 16
in_features = 32
out_features = 64
multiplier = 2.0
negative_slope = 0.1


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, multiplier, negative_slope]
