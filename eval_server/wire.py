"""Frames between the judge and the candidate's runner (one socketpair per evaluation).

A frame is a 4-byte big-endian length, a JSON object of that many bytes, then, when the object
has `"nbytes": n`, n raw bytes (tensor contents on CPU workers). Nothing is pickled: the judge
reads what the candidate's process wrote, so every frame is size-limited and parsed as data.
"""

from __future__ import annotations

import json
import math
import select
import socket
import struct
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from krl_common.fastjson import dumps_text

MAX_HEADER_BYTES = 1 << 20
_LEN = struct.Struct(">I")

# dtypes that may cross the boundary as tensor contents (by name: "float32", ...)
DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        str(d).removeprefix("torch."): d
        for d in (
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.bool,
        )
    }
)


class WireError(Exception):
    """The other side broke the protocol (closed, timed out, sent a malformed or oversized frame)."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    if payload:
        header = {**header, "nbytes": len(payload)}
    raw = dumps_text(header).encode()  # standard JSON: a non-finite float (an inf diff) is null
    sock.sendall(_LEN.pack(len(raw)) + raw)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise WireError("no answer from the candidate's process in time")
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise WireError("the candidate's process closed its channel")
        buf += chunk
    return bytes(buf)


def recv(
    sock: socket.socket, timeout_s: float | None = None, max_payload: int = 0
) -> tuple[dict[str, Any], bytes]:
    """One frame: (header, payload). Raises WireError on anything but a well-formed frame."""
    deadline = None if timeout_s is None or math.isinf(timeout_s) else time.monotonic() + timeout_s
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline))
    if n > MAX_HEADER_BYTES:
        raise WireError(f"a frame header of {n} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(_recv_exact(sock, n, deadline), parse_constant=_no_constant)
    except ValueError as exc:
        raise WireError(f"a malformed frame header ({exc})") from None
    if not isinstance(header, dict):
        raise WireError("a frame header that is not a JSON object")
    nbytes = header.get("nbytes", 0)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 <= nbytes <= max_payload:
        raise WireError(f"a frame payload of {nbytes!r} bytes (at most {max_payload})")
    return header, _recv_exact(sock, nbytes, deadline) if nbytes else b""


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}


def parse_meta(meta: Any, max_bytes: int) -> tuple[torch.dtype, tuple[int, ...], int]:
    """(dtype, shape, nbytes) of a tensor description from the other side, validated."""
    if not isinstance(meta, dict) or meta.get("dtype") not in DTYPES:
        raise WireError(f"a tensor description with an unknown dtype: {str(meta)[:200]}")
    shape = meta.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > 16
        or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40 for s in shape)
    ):
        raise WireError(f"a tensor description with a malformed shape: {str(shape)[:200]}")
    dtype = DTYPES[meta["dtype"]]
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes > max_bytes:
        raise WireError(f"a tensor of {nbytes} bytes (at most {max_bytes})")
    return dtype, tuple(shape), nbytes


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A CPU tensor's contents as bytes (contiguous copy when needed)."""
    t = t.detach().contiguous()
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")


def tensor_from(payload: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not payload:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape)
