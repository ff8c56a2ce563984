"""Megatron's per-group QKV layout and the gate/up stacking of fc1."""

from __future__ import annotations

import pytest
import torch

from slime_ext.convert import ConvertError
from slime_ext.convert.qkv import fuse_gate_up, fuse_qkv, split_gate_up, split_qkv

pytestmark = pytest.mark.unit


def test_qkv_layout_is_per_group() -> None:
    heads, groups, d, hidden = 6, 2, 3, 5
    # Row r of q belongs to head r // d: fill each row with a code that names head and projection.
    q = torch.arange(heads * d).repeat_interleave(hidden).reshape(heads * d, hidden).float()
    k = 100 + torch.arange(groups * d).repeat_interleave(hidden).reshape(groups * d, hidden).float()
    v = 200 + torch.arange(groups * d).repeat_interleave(hidden).reshape(groups * d, hidden).float()
    fused = fuse_qkv(q, k, v, heads, groups, d)
    codes = fused[:, 0].tolist()
    expected = []
    for g in range(groups):
        for h in range(g * 3, g * 3 + 3):
            expected += [h * d + i for i in range(d)]
        expected += [100 + g * d + i for i in range(d)] + [200 + g * d + i for i in range(d)]
    assert codes == expected
    q2, k2, v2 = split_qkv(fused, heads, groups, d)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def test_qkv_bias_round_trip() -> None:
    q, k, v = torch.randn(8 * 4), torch.randn(2 * 4), torch.randn(2 * 4)
    fused = fuse_qkv(q, k, v, 8, 2, 4)
    assert fused.shape == (48,)
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, 8, 2, 4), (q, k, v), strict=True))


def test_qkv_shape_errors() -> None:
    with pytest.raises(ConvertError, match="k: expected shape"):
        fuse_qkv(torch.zeros(8, 3), torch.zeros(3, 3), torch.zeros(4, 3), 4, 2, 2)
    with pytest.raises(ConvertError, match="not a multiple"):
        fuse_qkv(torch.zeros(8, 3), torch.zeros(4, 3), torch.zeros(4, 3), 5, 2, 2)
    with pytest.raises(ConvertError, match="linear_qkv: expected shape"):
        split_qkv(torch.zeros(10, 3), 4, 2, 2)


def test_gate_up() -> None:
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    fc1 = fuse_gate_up(gate, up)
    assert torch.equal(fc1[:6], gate) and torch.equal(fc1[6:], up)
    g2, u2 = split_gate_up(fc1)
    assert torch.equal(g2, gate) and torch.equal(u2, up)
    with pytest.raises(ConvertError, match="differ in shape"):
        fuse_gate_up(gate, torch.randn(5, 4))
    with pytest.raises(ConvertError, match="odd number of rows"):
        split_gate_up(torch.zeros(5, 4))
