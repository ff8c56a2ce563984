"""Small local stand-ins for the datasets the data tools read (nothing can be downloaded here):
a KernelBench-style problem tree / HF-style table, and KernelBook-style rows whose Triton answers
follow the Inductor layout of the real dataset (`<Name>New` class, `call(args)`, guard aliases)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# (file stem, torch op) per level: real KernelBench names, small shapes.
KB_LEVELS: dict[int, list[tuple[str, str]]] = {
    1: [
        ("19_ReLU", "torch.relu(x)"),
        ("20_LeakyReLU", "torch.nn.functional.leaky_relu(x, 0.01)"),
        ("21_Sigmoid", "torch.sigmoid(x)"),
        ("22_Tanh", "torch.tanh(x)"),
        ("23_Softmax", "torch.softmax(x, dim=1)"),
        ("24_LogSoftmax", "torch.log_softmax(x, dim=1)"),
        ("25_Swish", "x * torch.sigmoid(x)"),
        ("26_GELU_", "torch.nn.functional.gelu(x)"),
        ("27_SELU_", "torch.selu(x)"),
        ("28_HardSigmoid", "torch.nn.functional.hardsigmoid(x)"),
    ],
    2: [
        ("1_Conv2D_ReLU_BiasAdd", "torch.relu(x) + 1.0"),
        ("2_ConvTranspose2d_BiasAdd_Clamp", "torch.clamp(x + 0.5, 0.0, 1.0)"),
        ("3_Gemm_Scale_Tanh", "torch.tanh(x * 2.0)"),
        ("4_Conv2d_Mish_Mish", "x * torch.tanh(torch.nn.functional.softplus(x))"),
        ("5_Matmul_Sigmoid_Sum", "torch.sigmoid(x).sum(dim=1, keepdim=True)"),
    ],
    3: [
        ("1_MLP", "torch.relu(x).mean(dim=1, keepdim=True)"),
        ("2_ShallowWideMLP", "torch.relu(x) * 0.5"),
        ("3_DeepNarrowMLP", "torch.tanh(torch.relu(x))"),
    ],
}


def kb_source(stem: str, expr: str) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench-style problem {stem}."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return {expr}


batch_size = 16
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def write_kernelbench_tree(root: Path, levels: dict[int, list[tuple[str, str]]] = KB_LEVELS) -> Path:
    """A checkout-like tree: root/KernelBench/level<N>/<id>_<Name>.py. Returns root."""
    for level, items in levels.items():
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        for stem, expr in items:
            (folder / f"{stem}.py").write_text(kb_source(stem, expr), encoding="utf-8")
    return root


def kernelbench_rows(levels: dict[int, list[tuple[str, str]]] = KB_LEVELS) -> list[dict]:
    """Rows shaped like the HF dataset (code, level, name = file name, problem_id)."""
    return [
        {
            "code": kb_source(stem, expr),
            "level": level,
            "name": f"{stem}.py",
            "problem_id": int(stem.split("_")[0]),
        }
        for level, items in levels.items()
        for stem, expr in items
    ]


def write_kernelbench_hf(root: Path, fmt: str = "parquet") -> Path:
    """root/data/level_<N>-00000-of-00001.<fmt>, one file per level like the HF dataset."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = kernelbench_rows()
    for level in sorted({r["level"] for r in rows}):
        part = [r for r in rows if r["level"] == level]
        path = data / f"level_{level}-00000-of-00001.{fmt}"
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(part), path)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    return root
