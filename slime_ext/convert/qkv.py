"""Megatron's fused QKV layout and the fc1 gate/up stacking.

Megatron stores attention input projections as one `linear_qkv` tensor in per-group order: the
rows are viewed as `[G, n + 2, d]` (G query groups, n = heads / G query heads per group, d the head
dim); each group holds its n query heads, then its key head, then its value head. Tensor
parallelism splits that tensor by whole groups, which is why the order is per group and not
`[all q; all k; all v]`. The same layout applies to the qkv bias (Qwen2.5). `linear_fc1` of a
SwiGLU MLP is `cat([gate; up], dim 0)`.
"""

from __future__ import annotations

import torch

from slime_ext.convert.errors import ConvertError

__all__ = [
    "RowPiece",
    "fuse_gate_up",
    "fuse_qkv",
    "gate_up_row_pieces",
    "qkv_row_pieces",
    "split_gate_up",
    "split_qkv",
]


def _check(name: str, t: torch.Tensor, rows: int, trailing: tuple[int, ...]) -> None:
    if tuple(t.shape) != (rows, *trailing):
        raise ConvertError(f"{name}: expected shape {(rows, *trailing)}, got {tuple(t.shape)}")


# (HF part index, first source row, number of rows, first destination row in the fused tensor)
RowPiece = tuple[int, int, int, int]


def qkv_row_pieces(num_heads: int, num_groups: int, head_dim: int) -> list[RowPiece]:
    """Where the rows of q (part 0), k (1) and v (2) go in the fused per-group tensor."""
    if num_heads % num_groups:
        raise ConvertError(
            f"num_attention_heads {num_heads} is not a multiple of num_query_groups {num_groups}"
        )
    n, d = num_heads // num_groups, head_dim
    pieces: list[RowPiece] = []
    for g in range(num_groups):
        base = g * (n + 2) * d
        pieces += [
            (0, g * n * d, n * d, base),
            (1, g * d, d, base + n * d),
            (2, g * d, d, base + (n + 1) * d),
        ]
    return pieces


def gate_up_row_pieces(ffn_hidden_size: int) -> list[RowPiece]:
    """gate (part 0) fills the first half of fc1, up (part 1) the second."""
    return [(0, 0, ffn_hidden_size, 0), (1, 0, ffn_hidden_size, ffn_hidden_size)]


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> torch.Tensor:
    """[heads*d, ...], [G*d, ...], [G*d, ...] -> [G*(n+2)*d, ...] in per-group order (weights or biases)."""
    pieces = qkv_row_pieces(num_heads, num_groups, head_dim)
    trailing = tuple(q.shape[1:])
    _check("q", q, num_heads * head_dim, trailing)
    _check("k", k, num_groups * head_dim, trailing)
    _check("v", v, num_groups * head_dim, trailing)
    parts = (q, k, v)
    fused = torch.empty(((num_heads + 2 * num_groups) * head_dim, *trailing), dtype=q.dtype)
    for part, src, rows, dst in pieces:
        fused[dst : dst + rows] = parts[part][src : src + rows]
    return fused


def split_qkv(
    qkv: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of fuse_qkv; returns contiguous q, k, v."""
    pieces = qkv_row_pieces(num_heads, num_groups, head_dim)
    _check("linear_qkv", qkv, (num_heads + 2 * num_groups) * head_dim, tuple(qkv.shape[1:]))
    q, k, v = (
        torch.cat([qkv[dst : dst + rows] for p, _, rows, dst in pieces if p == part]) for part in range(3)
    )
    return q, k, v


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate [F, H], up [F, H] -> linear_fc1 [2F, H]."""
    if gate.shape != up.shape:
        raise ConvertError(f"gate_proj {tuple(gate.shape)} and up_proj {tuple(up.shape)} differ in shape")
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """linear_fc1 [2F, H] -> contiguous gate [F, H], up [F, H]."""
    if fc1.shape[0] % 2:
        raise ConvertError(f"linear_fc1 has an odd number of rows {fc1.shape[0]}")
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()
