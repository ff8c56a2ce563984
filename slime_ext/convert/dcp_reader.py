"""Reads regions of tensors from a DCP directory (torch_dist checkpoint) chunk by chunk.

Any chunking works (Megatron writes one chunk per layer per tensor-parallel rank, and splits the
SwiGLU fc1 into gate and up chunks): a region is assembled from the chunks that overlap it, so
memory stays at the size of the region plus one chunk.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from slime_ext.convert.errors import ConvertError

__all__ = ["DcpReader"]


class _FileSlice(io.RawIOBase):
    """A read-only window [offset, offset + length) of an open file. torch.load reads records
    through `readinto` straight into tensor storage, so a chunk costs its size once in memory."""

    def __init__(self, fh: io.BufferedReader, offset: int, length: int) -> None:
        super().__init__()
        self._fh, self._start, self._len, self._pos = fh, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buf), self._len - self._pos)
        if n <= 0:
            return 0
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(memoryview(buf)[:n])
        self._pos += got
        return got


_STORAGE_DTYPES = {
    "BFloat16Storage": torch.bfloat16,
    "HalfStorage": torch.float16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
}
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # zip local file header


class _TensorLayout(pickle.Unpickler):
    """Reads the `data.pkl` of a torch.save'd tensor without building it: returns
    (storage type name, record key, storage numel, offset, size, stride). Anything but a plain
    `_rebuild_tensor_v2` of one storage raises, and the caller falls back to torch.load."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: (*storage, offset, tuple(size), tuple(stride))
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return (pid[1], pid[2], pid[4])


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(size):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _record_start(window: _FileSlice, info: zipfile.ZipInfo) -> int | None:
    """Where a stored (uncompressed) zip record's bytes start, from its local header."""
    window.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(window.read(_LOCAL_HEADER.size))
    if fields[0] != 0x04034B50 or info.compress_type != zipfile.ZIP_STORED:
        return None
    return info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]


def _raw_data_offset(window: _FileSlice, sizes: tuple[int, ...], dtype: torch.dtype) -> int | None:
    """Offset (within the window) of the raw bytes of a compact, contiguous tensor of this size and
    dtype saved with torch.save, or None when the record is anything else. Records are read from
    their local headers: the writer may have skipped the CRC32s (zipfile would reject them)."""
    try:
        with zipfile.ZipFile(window) as zf:
            pkl = [i for i in zf.infolist() if i.filename.endswith("/data.pkl")]
            if len(pkl) != 1:
                return None
            start = _record_start(window, pkl[0])
            if start is None:
                return None
            window.seek(start)
            stype, key, numel, offset, size, stride = _TensorLayout(
                io.BytesIO(window.read(pkl[0].file_size))
            ).load()
            info = zf.getinfo(f"{pkl[0].filename[: -len('data.pkl')]}data/{key}")
            nbytes = int(torch.Size(sizes).numel()) * dtype.itemsize
            if (
                _STORAGE_DTYPES.get(stype) != dtype
                or offset != 0
                or size != tuple(sizes)
                or stride != _contiguous_strides(size)
                or numel * dtype.itemsize != nbytes
                or info.file_size != nbytes
            ):
                return None
            return _record_start(window, info)
    except (
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        KeyError,
        ValueError,
        TypeError,
        EOFError,
        struct.error,
    ):
        return None


class DcpReader:
    def __init__(self, ckpt_dir: Path) -> None:
        self.dir = Path(ckpt_dir)
        path = self.dir / ".metadata"
        if not path.is_file():
            raise ConvertError(f"{self.dir} is not a torch_dist checkpoint: no .metadata")
        with open(path, "rb") as fh:
            self.metadata: Metadata = pickle.load(fh)
        self._storage = self.metadata.storage_data or {}

    def tensor_keys(self) -> list[str]:
        return [
            k for k, v in self.metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
        ]

    def _md(self, key: str) -> TensorStorageMetadata:
        md = self.metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise ConvertError(f"tensor {key!r} is missing from the checkpoint {self.dir}")
        return md

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._md(key).size)

    def dtype(self, key: str) -> torch.dtype:
        return self._md(key).properties.dtype

    def _load_chunk(self, key: str, offsets: torch.Size, out: torch.Tensor | None = None) -> torch.Tensor:
        """One stored chunk. With `out` (contiguous, the chunk's shape and dtype), a plain
        torch.save'd chunk is read straight into it - no allocation, no fresh pages."""
        info = self._storage.get(MetadataIndex(key, offsets))
        if info is None:
            raise ConvertError(f"{key}: no storage entry for the chunk at {tuple(offsets)}")
        path = self.dir / info.relative_path
        if path.stat().st_size < info.offset + info.length:
            raise ConvertError(f"{info.relative_path} is truncated (chunk of {key} at {tuple(offsets)})")
        if getattr(info, "transform_descriptors", None):
            raise ConvertError(f"{key}: stored with transforms {info.transform_descriptors}, not supported")
        with open(path, "rb") as fh:
            window = _FileSlice(fh, info.offset, info.length)
            if out is not None and out.is_contiguous():
                start = _raw_data_offset(window, tuple(out.shape), out.dtype)
                if start is not None:
                    window.seek(start)
                    if window.readinto(memoryview(out.reshape(-1).view(torch.uint8).numpy())) != out.nbytes:
                        raise ConvertError(f"{info.relative_path}: short read of {key} at {tuple(offsets)}")
                    return out
                window.seek(0)
            try:
                return torch.load(window, map_location="cpu", weights_only=True)
            except RuntimeError as exc:
                raise ConvertError(
                    f"{info.relative_path}: cannot read the chunk of {key} at {tuple(offsets)}: {exc}"
                ) from exc

    def read(
        self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...], out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The region [offsets, offsets + sizes) of a global tensor; when it is exactly one stored
        chunk and `out` (a reusable buffer of that shape and dtype) is given, it is read into `out`."""
        md = self._md(key)
        if len(offsets) != len(md.size) or any(
            o + s > g for o, s, g in zip(offsets, sizes, md.size, strict=True)
        ):
            raise ConvertError(f"{key}: region {sizes} at {offsets} is outside {tuple(md.size)}")
        for chunk in md.chunks:  # the region is exactly one chunk: no assembly copy
            if tuple(chunk.offsets) == tuple(offsets) and tuple(chunk.sizes) == tuple(sizes):
                fits = (
                    out is not None and tuple(out.shape) == tuple(sizes) and out.dtype == md.properties.dtype
                )
                data = self._load_chunk(key, chunk.offsets, out if fits else None)
                if tuple(data.shape) != tuple(sizes):
                    raise ConvertError(
                        f"{key}: chunk at {tuple(offsets)} holds {tuple(data.shape)}, "
                        f"metadata says {tuple(sizes)}"
                    )
                return data
        out = torch.empty(sizes, dtype=md.properties.dtype)
        filled = 0
        for chunk in md.chunks:
            lo = [max(o, c) for o, c in zip(offsets, chunk.offsets, strict=True)]
            hi = [
                min(o + s, c + cs)
                for o, s, c, cs in zip(offsets, sizes, chunk.offsets, chunk.sizes, strict=True)
            ]
            if any(a >= b for a, b in zip(lo, hi, strict=True)):
                continue
            data = self._load_chunk(key, chunk.offsets)
            if tuple(data.shape) != tuple(chunk.sizes):
                raise ConvertError(
                    f"{key}: chunk at {tuple(chunk.offsets)} holds {tuple(data.shape)}, "
                    f"metadata says {tuple(chunk.sizes)}"
                )
            src = data[tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, chunk.offsets, strict=True))]
            out[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets, strict=True))] = src
            filled += src.numel()
            del data
        if filled != out.numel():
            raise ConvertError(f"{key}: chunks cover {filled} of {out.numel()} elements of the region")
        return out
