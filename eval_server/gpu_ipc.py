"""CUDA driver calls for two processes that share device memory and order their streams: the
judge and the candidate's runner (judge/, runner/). Bound through ctypes on the driver torch
loaded (`libcuda.so.1`), on whatever context torch made current.

Why the driver and not torch: interprocess CUDA events cannot be waited on before they are
recorded (a wait on an event not yet recorded is a no-op), so a stream cannot be queued behind
"the other process's next signal". Stream memory operations can: `cuStreamWaitValue32` blocks a
stream in the GPU's front end (no SM is held, so the other context runs) until a 32-bit word
reaches a value, and `cuStreamWriteValue32` writes one after the stream's earlier work, behind a
memory fence. Each side queues its waits ahead, and nothing of either host's timing is between
a "go" and a "done". IPC handles name whole allocations, so memory meant for the other process
comes from `alloc` (one cuMemAlloc per buffer), never from torch's caching allocator, whose
segments also hold the exporter's private tensors.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from eval_server.checks.runtime import RawCudaBytes

HANDLE_BYTES = 64
WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0
WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: preceded by a memory fence
IPC_LAZY_PEER = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class DriverError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the driver's error)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


@functools.lru_cache(maxsize=1)
def _lib() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DriverError(f"the CUDA driver library could not be loaded: {exc}") from None


def _fn(name: str, *argtypes: Any) -> Any:
    lib = _lib()
    for candidate in (f"{name}_v2", name):
        f = getattr(lib, candidate, None)
        if f is not None:
            f.restype = ctypes.c_int
            f.argtypes = list(argtypes)
            return f
    raise DriverError(f"the CUDA driver has no {name}")


def _check(code: int, what: str) -> None:
    if code != 0:
        msg = ctypes.c_char_p()
        _lib().cuGetErrorString(code, ctypes.byref(msg))
        text = msg.value.decode(errors="replace") if msg.value else f"error {code}"
        raise DriverError(f"{what}: {text}")


_u64 = ctypes.c_uint64
_SIGNATURES: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "cuMemAlloc": (ctypes.POINTER(_u64), ctypes.c_size_t),
        "cuMemFree": (_u64,),
        "cuIpcGetMemHandle": (ctypes.POINTER(_Handle), _u64),
        "cuIpcOpenMemHandle": (ctypes.POINTER(_u64), _Handle, ctypes.c_uint),
        "cuIpcCloseMemHandle": (_u64,),
        "cuMemGetAddressRange": (ctypes.POINTER(_u64), ctypes.POINTER(ctypes.c_size_t), _u64),
        "cuStreamWaitValue32": (ctypes.c_void_p, _u64, ctypes.c_uint32, ctypes.c_uint),
        "cuStreamWriteValue32": (ctypes.c_void_p, _u64, ctypes.c_uint32, ctypes.c_uint),
    }
)


@functools.cache
def _bound(name: str) -> Any:
    return _fn(name, *_SIGNATURES[name])


def ensure_context(device: torch.device) -> None:
    """Make torch's context of `device` current on this thread (the driver calls use it)."""
    torch.cuda.set_device(device)
    torch.empty(1, device=device)


def alloc(nbytes: int) -> int:
    """One device allocation of its own (exportable alone); free with `free`."""
    ptr = _u64()
    _check(_bound("cuMemAlloc")(ctypes.byref(ptr), max(1, int(nbytes))), f"cuMemAlloc({nbytes})")
    return int(ptr.value)


def free(ptr: int) -> None:
    _check(_bound("cuMemFree")(ptr), "cuMemFree")


def address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the allocation that holds `ptr`."""
    base, size = _u64(), ctypes.c_size_t()
    _check(
        _bound("cuMemGetAddressRange")(ctypes.byref(base), ctypes.byref(size), ptr), "cuMemGetAddressRange"
    )
    return int(base.value), int(size.value)


def export(ptr: int) -> bytes:
    """The IPC handle of the allocation `ptr` starts (64 bytes)."""
    handle = _Handle()
    _check(_bound("cuIpcGetMemHandle")(ctypes.byref(handle), ptr), "cuIpcGetMemHandle")
    return bytes(handle)  # the whole struct: .reserved would stop at the first NUL


def open_handle(handle: bytes) -> int:
    """Map another process's allocation into this context; returns its base address here."""
    if len(handle) != HANDLE_BYTES:
        raise DriverError(f"an IPC handle has {HANDLE_BYTES} bytes, got {len(handle)}")
    h = _Handle.from_buffer_copy(handle)
    ptr = _u64()
    _check(_bound("cuIpcOpenMemHandle")(ctypes.byref(ptr), h, IPC_LAZY_PEER), "cuIpcOpenMemHandle")
    return int(ptr.value)


def close_handle(ptr: int) -> None:
    _check(_bound("cuIpcCloseMemHandle")(ptr), "cuIpcCloseMemHandle")


def wait_value(stream: torch.cuda.Stream, ptr: int, value: int) -> None:
    """Queue on `stream`: wait until the 32-bit word at `ptr` is >= value (wrapping compare)."""
    _check(
        _bound("cuStreamWaitValue32")(stream.cuda_stream, ptr, value & 0xFFFFFFFF, WAIT_GEQ),
        "cuStreamWaitValue32",
    )


def write_value(stream: torch.cuda.Stream, ptr: int, value: int) -> None:
    """Queue on `stream`: after its earlier work (and a memory fence), write `value` at `ptr`."""
    _check(
        _bound("cuStreamWriteValue32")(stream.cuda_stream, ptr, value & 0xFFFFFFFF, WRITE_DEFAULT),
        "cuStreamWriteValue32",
    )


def tensor_at(
    ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """A contiguous tensor over `nbytes` of device memory at `ptr` (not owned: keep the memory alive)."""
    raw = torch.as_tensor(RawCudaBytes(ptr, nbytes), device=device)
    return raw.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype, device=device)


@dataclass
class SharedBuffer:
    """A device allocation of its own, exported to the other process: `tensor` is this side's view."""

    ptr: int
    nbytes: int
    handle: bytes
    tensor: torch.Tensor

    @classmethod
    def create(
        cls, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
    ) -> SharedBuffer:
        ptr = alloc(nbytes)
        try:
            return cls(ptr, nbytes, export(ptr), tensor_at(ptr, nbytes, dtype, shape, device))
        except BaseException:
            free(ptr)
            raise

    def release(self) -> None:
        self.tensor = torch.empty(0)
        free(self.ptr)
