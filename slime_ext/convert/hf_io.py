"""Hugging Face checkpoint I/O that never holds more than one tensor: a memory-mapped reader over
`model.safetensors` or an index of shards, and a streaming safetensors writer.

The writer knows every (name, dtype, shape) up front, so it writes each shard's header first and
then appends tensor bytes one at a time, in the planned order; shards and the index follow the
layout of `save_pretrained` (`model-0000i-of-0000n.safetensors`, `model.safetensors.index.json`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import safe_open

from slime_ext.convert.errors import ConvertError

__all__ = ["HFReader", "SafetensorsWriter", "TensorPlan", "read_hf_config", "DTYPES"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# safetensors dtype codes for the dtypes a model checkpoint holds.
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ConvertError(f"no config.json in {hf_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConvertError(f"{path} is not valid JSON: {exc}") from exc


class HFReader:
    """Name -> tensor over the safetensors files of an HF directory (memory-mapped, lazy)."""

    def __init__(self, hf_dir: Path) -> None:
        self.dir = Path(hf_dir)
        index = self.dir / INDEX_NAME
        if index.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise ConvertError(f"{index} is not a safetensors index: {exc}") from exc
        elif (self.dir / SINGLE_NAME).is_file():
            with safe_open(self.dir / SINGLE_NAME, framework="pt") as f:
                weight_map = {k: SINGLE_NAME for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        else:
            raise ConvertError(f"no {SINGLE_NAME} or {INDEX_NAME} in {self.dir}")
        missing = sorted({f for f in weight_map.values() if not (self.dir / f).is_file()})
        if missing:
            raise ConvertError(f"{self.dir}: safetensors files listed in the index are missing: {missing}")
        self.weight_map = weight_map
        self._open: dict[str, Any] = {}

    def names(self) -> list[str]:
        return list(self.weight_map)

    def _handle(self, fname: str) -> Any:
        if fname not in self._open:
            self._open[fname] = safe_open(self.dir / fname, framework="pt")
        return self._open[fname]

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise ConvertError(f"tensor {name!r} is missing from {self.dir}")
        return self._handle(self.weight_map[name]).get_tensor(name)

    def close(self) -> None:
        self._open.clear()


@dataclass(frozen=True)
class TensorPlan:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


def _shards(plan: Sequence[TensorPlan], max_shard_bytes: int) -> list[list[TensorPlan]]:
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for t in plan:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def _header(shard: Sequence[TensorPlan]) -> bytes:
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in shard:
        if t.dtype not in _ST_DTYPES:
            raise ConvertError(f"{t.name}: dtype {t.dtype} cannot be written to safetensors here")
        entries[t.name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                           "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor, without a copy when it is already contiguous."""
    flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


class SafetensorsWriter:
    """Writes a planned list of tensors into one or more safetensors shards, streaming.

    `write(name, tensor)` must follow the plan's order; `close()` checks everything was written
    and writes the index (several shards) or leaves a single `model.safetensors`."""

    def __init__(self, out_dir: Path, plan: Sequence[TensorPlan], max_shard_bytes: int) -> None:
        self.dir = Path(out_dir)
        self.shards = _shards(plan, max_shard_bytes)
        n = len(self.shards)
        self.files = [SINGLE_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._order: Iterator[tuple[int, TensorPlan]] = (
            (i, t) for i, shard in enumerate(self.shards) for t in shard
        )
        self._shard = -1
        self._fh: BinaryIO | None = None
        self.total_bytes = sum(t.nbytes for t in plan)

    def _open_shard(self, i: int) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = open(self.dir / self.files[i], "wb")  # noqa: SIM115 (closed by the next shard / close())
        self._fh.write(_header(self.shards[i]))
        self._shard = i

    def write(self, name: str, tensor: torch.Tensor) -> None:
        try:
            shard, expect = next(self._order)
        except StopIteration:
            raise ConvertError(f"tensor {name!r} was not planned") from None
        if name != expect.name or tensor.dtype != expect.dtype or tuple(tensor.shape) != expect.shape:
            raise ConvertError(f"writing {name} {tensor.dtype} {tuple(tensor.shape)}, planned "
                               f"{expect.name} {expect.dtype} {expect.shape}")
        if shard != self._shard:
            self._open_shard(shard)
        assert self._fh is not None
        self._fh.write(tensor_bytes(tensor))

    def close(self) -> None:
        leftover = next(self._order, None)
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if leftover is not None:
            raise ConvertError(f"tensor {leftover[1].name!r} was planned but never written")
        if len(self.files) > 1:
            index = {"metadata": {"total_size": self.total_bytes},
                     "weight_map": {t.name: self.files[i] for i, s in enumerate(self.shards) for t in s}}
            (self.dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
