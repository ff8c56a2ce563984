"""Plain matrix multiplication C = A @ B."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Multiplies A (M, K) by B (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 64
K = 32
N = 64


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
