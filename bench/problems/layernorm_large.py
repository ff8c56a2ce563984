"""LayerNorm over the last dim of a (4096, 8192) fp32 tensor, with elementwise affine (level 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies nn.LayerNorm(normalized_features) (eps 1e-5, learnable weight and bias)."""

    def __init__(self, normalized_features: int):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


# Sizes: ALL_CAPS integers (bench.corpus.shrunk_problem divides them for interpreter tests).
BATCH = 4096
FEATURES = 8192


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [FEATURES]
