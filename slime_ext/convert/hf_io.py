"""Hugging Face checkpoint I/O that never holds more than one tensor: a reader over
`model.safetensors` or an index of shards (positioned reads, one tensor at a time), and a
streaming safetensors writer.

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

from slime_ext.convert.errors import ConvertError

__all__ = [
    "DTYPES",
    "HFReader",
    "SafetensorsWriter",
    "TensorPlan",
    "read_hf_config",
    "read_safetensors_header",
    "tensor_bytes",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# safetensors dtype codes for the dtypes a model checkpoint holds.
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}
_DTYPES_BY_CODE = {v: k for k, v in _ST_DTYPES.items()}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ConvertError(f"no config.json in {hf_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConvertError(f"{path} is not valid JSON: {exc}") from exc


def read_safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """(start of the data section, header dict) of one safetensors file."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ConvertError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", raw)
        if size > 100 << 20:
            raise ConvertError(f"{path} is not a safetensors file (header of {size} bytes)")
        try:
            header = json.loads(fh.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConvertError(f"{path}: unreadable safetensors header: {exc}") from exc
    header.pop("__metadata__", None)
    return 8 + size, header


class HFReader:
    """Name -> tensor over the safetensors files of an HF directory.

    Tensors are read with plain positioned reads into freshly allocated tensors, not through a
    memory map: mapped pages would stay resident (and count in the process's RSS) for as long as
    the file is open, so converting a 16 GB checkpoint would look like a 16 GB process."""

    def __init__(self, hf_dir: Path) -> None:
        self.dir = Path(hf_dir)
        index = self.dir / INDEX_NAME
        if index.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise ConvertError(f"{index} is not a safetensors index: {exc}") from exc
        elif (self.dir / SINGLE_NAME).is_file():
            weight_map = {}
        else:
            raise ConvertError(f"no {SINGLE_NAME} or {INDEX_NAME} in {self.dir}")
        files = sorted(set(weight_map.values())) or [SINGLE_NAME]
        missing = [f for f in files if not (self.dir / f).is_file()]
        if missing:
            raise ConvertError(f"{self.dir}: safetensors files listed in the index are missing: {missing}")
        self._entries: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for fname in files:
            start, header = read_safetensors_header(self.dir / fname)
            for name, entry in header.items():
                if weight_map and weight_map.get(name) != fname:
                    continue
                self._entries[name] = (fname, start, entry)
        absent = sorted(set(weight_map) - set(self._entries))
        if absent:
            raise ConvertError(
                f"{self.dir}: tensors listed in the index are not in their files: {absent[:5]}"
            )

    def names(self) -> list[str]:
        return list(self._entries)

    def dtype(self, name: str) -> torch.dtype | None:
        """The stored dtype of a tensor (None for a dtype the reader does not support)."""
        return _DTYPES_BY_CODE.get(self._entries[name][2]["dtype"]) if name in self._entries else None

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._entries:
            raise ConvertError(f"tensor {name!r} is missing from {self.dir}")
        return tuple(self._entries[name][2]["shape"])

    def get(self, name: str) -> torch.Tensor:
        dtype = self.dtype(name)
        if dtype is None:
            raise ConvertError(f"{name}: missing from {self.dir} or of an unsupported dtype")
        out = torch.empty(self.shape(name), dtype=dtype)
        if out.numel():
            self.read_rows(name, 0, out)
        return out

    def read_rows(self, name: str, first_row: int, out: torch.Tensor) -> None:
        """Read rows [first_row, first_row + len(out)) of a stored tensor straight into `out`."""
        if name not in self._entries:
            raise ConvertError(f"tensor {name!r} is missing from {self.dir}")
        fname, start, entry = self._entries[name]
        shape, dtype = tuple(entry["shape"]), _DTYPES_BY_CODE.get(entry["dtype"])
        if dtype is None:
            raise ConvertError(f"{name}: safetensors dtype {entry['dtype']} is not supported")
        begin, end = entry["data_offsets"]
        row_bytes = int(torch.Size(shape[1:]).numel()) * dtype.itemsize
        if row_bytes * (shape[0] if shape else 1) != end - begin:
            raise ConvertError(f"{fname}: {name} has {end - begin} bytes for shape {list(shape)}")
        if out.dtype != dtype or tuple(out.shape[1:]) != shape[1:] or first_row + out.shape[0] > shape[0]:
            raise ConvertError(
                f"{name}: stored {dtype} {list(shape)}, asked for rows {first_row}..{first_row + out.shape[0]} "
                f"as {out.dtype} {list(out.shape)}"
            )
        if not out.is_contiguous():
            raise ConvertError(f"{name}: destination of a row read must be contiguous")
        with open(self.dir / fname, "rb") as fh:
            fh.seek(start + begin + first_row * row_bytes)
            got = fh.readinto(tensor_bytes(out))
        if got != out.numel() * dtype.itemsize:
            raise ConvertError(f"{fname} is truncated (tensor {name})")

    def close(self) -> None:
        self._entries.clear()


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
        entries[t.name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
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
        self.files = (
            [SINGLE_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        )
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
            raise ConvertError(
                f"writing {name} {tensor.dtype} {tuple(tensor.shape)}, planned "
                f"{expect.name} {expect.dtype} {expect.shape}"
            )
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
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": {t.name: self.files[i] for i, s in enumerate(self.shards) for t in s},
            }
            (self.dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
