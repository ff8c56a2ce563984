"""Frames between the judge and the runner (eval_server/wire.py): what the judge accepts."""

from __future__ import annotations

import socket
import struct

import pytest
import torch

from eval_server import wire

pytestmark = pytest.mark.unit


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_a_frame_with_payload_round_trips() -> None:
    a, b = _pair()
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    wire.send(a, {"op": "call", **wire.tensor_meta(t)}, wire.tensor_bytes(t))
    header, payload = wire.recv(b, timeout_s=5, max_payload=1 << 20)
    dtype, shape, nbytes = wire.parse_meta(header, 1 << 20)
    assert header["op"] == "call" and nbytes == len(payload) == 24
    assert torch.equal(wire.tensor_from(payload, dtype, shape), t)


def test_non_finite_numbers_cross_as_null() -> None:
    a, b = _pair()
    wire.send(a, {"report": {"max_abs_diff": float("inf"), "x": float("nan")}})
    header, _ = wire.recv(b, timeout_s=5)
    assert header == {"report": {"max_abs_diff": None, "x": None}}


@pytest.mark.parametrize(
    "raw, match",
    [
        (struct.pack(">I", wire.MAX_HEADER_BYTES + 1), "frame header of"),
        (struct.pack(">I", 3) + b"[1]", "not a JSON object"),
        (struct.pack(">I", 12) + b'{"a": NaN}  ', "malformed"),
        (struct.pack(">I", 13) + b'{"nbytes": 9}', "payload"),
        (struct.pack(">I", 16) + b'{"nbytes": true}', "payload"),
    ],
)
def test_malformed_frames_are_refused(raw: bytes, match: str) -> None:
    a, b = _pair()
    a.sendall(raw)
    with pytest.raises(wire.WireError, match=match):
        wire.recv(b, timeout_s=5, max_payload=8)


def test_a_closed_or_silent_peer_is_an_error_not_a_hang() -> None:
    a, b = _pair()
    with pytest.raises(wire.WireError, match="in time"):
        wire.recv(b, timeout_s=0.05)
    a.close()
    with pytest.raises(wire.WireError, match="closed"):
        wire.recv(b, timeout_s=5)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"dtype": "complex64", "shape": [2]}, "unknown dtype"),
        ({"dtype": "float32", "shape": [-1]}, "malformed shape"),
        ({"dtype": "float32", "shape": [True]}, "malformed shape"),
        ({"dtype": "float32", "shape": [1 << 20, 1 << 20]}, "bytes"),
        ("float32", "unknown dtype"),
    ],
)
def test_tensor_descriptions_are_validated(meta: object, match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.parse_meta(meta, 1 << 30)
