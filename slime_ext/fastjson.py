"""Compact JSON encode/decode: orjson when it is installed, else the standard library.

Trajectory records carry thousands of token ids and log-probabilities; the standard library
spends about 0.5 us per float in each direction (a 4k-token record: ~2.5 ms to decode, ~4.7 ms
to encode), orjson about a tenth of that. orjson ships with SGLang (so the slime image has it)
and is in this package's `buffer` and `dev` extras, but nothing requires it: without it
everything works, only slower. `BACKEND` says which one is in use.

Both backends give the same result for what this project sends: UTF-8 bytes, no whitespace,
non-ASCII characters unescaped. Both reject the non-standard literals NaN, Infinity and
-Infinity when decoding. Encoding non-finite floats is not defined here (orjson writes null,
the standard library raises); validated records never contain them.
"""

from __future__ import annotations

import json
import os
from typing import Any

try:  # pragma: no cover - which branch runs depends on the environment
    if os.environ.get("SLIME_EXT_JSON", "").lower() == "stdlib":
        raise ImportError("SLIME_EXT_JSON=stdlib")
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

__all__ = ["BACKEND", "STRICT_DECODER", "dumps", "loads"]

BACKEND = "orjson" if _orjson is not None else "json"
# True when every value `loads` returns is a JSON value that round-trips: finite floats (orjson
# rejects 1e400; the standard library turns it into inf), integers within 64 bits (orjson turns
# larger ones into floats), valid Unicode (the standard library lets lone surrogates through).
STRICT_DECODER = _orjson is not None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (only finite numbers are allowed)")


def loads(data: bytes | str) -> Any:
    """Decode one JSON document; raises ValueError (with the position) on invalid JSON."""
    if _orjson is not None:
        return _orjson.loads(data)  # orjson.JSONDecodeError is a ValueError
    return json.loads(data, parse_constant=_reject_constant)


def dumps(obj: Any) -> bytes:
    """Encode as compact UTF-8 JSON bytes."""
    if _orjson is not None:
        return _orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
