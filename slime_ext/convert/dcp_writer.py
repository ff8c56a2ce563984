"""A streaming writer of torch.distributed.checkpoint (DCP) directories, as Megatron's torch_dist
backend lays them out: `__0_<i>.distcp` data files and a pickled `.metadata`.

torch's own `FileSystemWriter` needs the whole state dict in memory; this writer takes one chunk
at a time. Each chunk is serialised exactly as DCP does it (`torch.save` of the chunk-shaped tensor
appended to the data file; objects as raw bytes) and recorded with torch's own metadata classes
(`TensorStorageMetadata`, `ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`), so torch's
`FileSystemReader` and Megatron's `dist_checkpointing.load` read the result.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from slime_ext.convert.errors import ConvertError

__all__ = ["DcpWriter", "DCP_VERSION"]

DCP_VERSION = "1.0.0"  # torch's CURRENT_DCP_VERSION for FileSystemWriter checkpoints


@contextmanager
def _no_zip_crc() -> Iterator[None]:
    """torch.save without the zip CRC32 of the payload (torch >= 2.6 option): the CRC pass costs as
    much as the write itself, and torch.load does not check it."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        yield
        return
    old = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = old


class DcpWriter:
    """Append chunks of declared global tensors (and byte objects) to a DCP directory."""

    def __init__(self, out_dir: Path, max_file_bytes: int = 4 << 30) -> None:
        self.dir = Path(out_dir)
        self.max_file_bytes = max_file_bytes
        self._tensors: dict[str, TensorStorageMetadata] = {}
        self._objects: set[str] = set()
        self._storage: dict[MetadataIndex, _StorageInfo] = {}
        self._file_index = -1
        self._fh: BinaryIO | None = None
        self._fname = ""

    def declare(self, key: str, global_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        if key in self._tensors or key in self._objects:
            raise ConvertError(f"DCP key {key!r} declared twice")
        self._tensors[key] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype), size=torch.Size(global_shape), chunks=[]
        )

    def _stream(self) -> BinaryIO:
        if self._fh is None or self._fh.tell() >= self.max_file_bytes:
            if self._fh is not None:
                self._fh.close()
            self._file_index += 1
            self._fname = f"__0_{self._file_index}.distcp"
            self._fh = open(self.dir / self._fname, "wb")  # noqa: SIM115 (closed on rotation / finish)
        return self._fh

    def write_chunk(self, key: str, offsets: tuple[int, ...], chunk: torch.Tensor) -> None:
        """Write `chunk` (shaped like the region it covers) at `offsets` of the declared tensor."""
        md = self._tensors.get(key)
        if md is None:
            raise ConvertError(f"DCP key {key!r} written before it was declared")
        if chunk.dtype != md.properties.dtype:
            raise ConvertError(f"{key}: chunk dtype {chunk.dtype}, declared {md.properties.dtype}")
        if (
            len(offsets) != len(md.size)
            or chunk.dim() != len(md.size)
            or any(o < 0 or o + s > g for o, s, g in zip(offsets, chunk.shape, md.size, strict=True))
        ):
            raise ConvertError(
                f"{key}: chunk {tuple(chunk.shape)} at {offsets} does not fit {tuple(md.size)}"
            )
        # torch.save writes a tensor's whole storage: make the chunk compact first.
        chunk = chunk.contiguous()
        if chunk.untyped_storage().nbytes() != chunk.numel() * chunk.element_size():
            chunk = chunk.clone()
        fh = self._stream()
        start = fh.tell()
        with _no_zip_crc():
            torch.save(chunk, fh)
        index = MetadataIndex(key, torch.Size(offsets))
        if index in self._storage:
            raise ConvertError(f"{key}: a chunk at {offsets} was already written")
        self._storage[index] = _StorageInfo(self._fname, start, fh.tell() - start)
        md.chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=chunk.shape))

    def write_object(self, key: str, obj: Any) -> None:
        """Store a picklable object as DCP bytes, serialised as Megatron stores a ShardedObject."""
        if key in self._tensors or key in self._objects:
            raise ConvertError(f"DCP key {key!r} written twice")
        buf = io.BytesIO()
        torch.save(obj, buf)
        fh = self._stream()
        start = fh.tell()
        fh.write(buf.getbuffer())
        self._objects.add(key)
        self._storage[MetadataIndex(key)] = _StorageInfo(self._fname, start, fh.tell() - start)

    def finish(self) -> None:
        """Check every declared tensor is fully covered, then write `.metadata`."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for key, md in self._tensors.items():
            covered = sum(int(torch.Size(c.sizes).numel()) for c in md.chunks)
            if covered != md.size.numel():
                raise ConvertError(f"{key}: chunks cover {covered} of {md.size.numel()} elements")
        state: dict[str, Any] = dict(self._tensors)
        state.update({k: BytesStorageMetadata() for k in self._objects})
        metadata = Metadata(
            state_dict_metadata=state,
            planner_data={k: (k,) for k in state},
            storage_data=self._storage,
            storage_meta=StorageMeta(checkpoint_id=None, save_id=None, load_id=None, modules=[]),
            version=DCP_VERSION,
        )
        with open(self.dir / ".metadata", "wb") as fh:
            pickle.dump(metadata, fh)

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
