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

__all__ = ["fuse_gate_up", "fuse_qkv", "split_gate_up", "split_qkv"]


def _check(name: str, t: torch.Tensor, rows: int, trailing: tuple[int, ...]) -> None:
    if tuple(t.shape) != (rows, *trailing):
        raise ConvertError(f"{name}: expected shape {(rows, *trailing)}, got {tuple(t.shape)}")


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> torch.Tensor:
    """[heads*d, ...], [G*d, ...], [G*d, ...] -> [G*(n+2)*d, ...] in per-group order (weights or biases)."""
    if num_heads % num_groups:
        raise ConvertError(
            f"num_attention_heads {num_heads} is not a multiple of num_query_groups {num_groups}"
        )
    trailing = tuple(q.shape[1:])
    _check("q", q, num_heads * head_dim, trailing)
    _check("k", k, num_groups * head_dim, trailing)
    _check("v", v, num_groups * head_dim, trailing)
    n = num_heads // num_groups
    fused = torch.cat(
        [
            q.reshape(num_groups, n, head_dim, *trailing),
            k.reshape(num_groups, 1, head_dim, *trailing),
            v.reshape(num_groups, 1, head_dim, *trailing),
        ],
        dim=1,
    )
    return fused.reshape(num_groups * (n + 2) * head_dim, *trailing)


def split_qkv(
    qkv: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of fuse_qkv; returns contiguous q, k, v."""
    if num_heads % num_groups:
        raise ConvertError(
            f"num_attention_heads {num_heads} is not a multiple of num_query_groups {num_groups}"
        )
    n = num_heads // num_groups
    trailing = tuple(qkv.shape[1:])
    _check("linear_qkv", qkv, num_groups * (n + 2) * head_dim, trailing)
    grouped = qkv.reshape(num_groups, n + 2, head_dim, *trailing)
    q, k, v = torch.split(grouped, [n, 1, 1], dim=1)
    return (
        q.reshape(num_heads * head_dim, *trailing).contiguous(),
        k.reshape(num_groups * head_dim, *trailing).contiguous(),
        v.reshape(num_groups * head_dim, *trailing).contiguous(),
    )


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
