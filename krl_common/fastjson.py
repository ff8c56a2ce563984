"""Compact JSON encode/decode: orjson when it is installed, else the standard library.

Trajectory records carry thousands of token ids and log-probabilities; the standard library
spends about 0.5 us per float in each direction (a 4k-token record: ~2.5 ms to decode, ~4.7 ms
to encode), orjson about a tenth of that. orjson ships with SGLang (so the slime image has it)
and is in this package's `buffer` and `dev` extras, but nothing requires it: without it
everything works, only slower. `BACKEND` says which one is in use.

Both backends give the same result for what this project sends: UTF-8 bytes, no whitespace,
non-ASCII characters unescaped. Both reject the non-standard literals NaN, Infinity and
-Infinity when decoding, and neither ever writes them: a non-finite float (NaN, +inf, -inf)
is encoded as `null` (orjson does that itself; the standard library path replaces them with
`finite` and encodes with allow_nan=False). `dumps_text` is the same rule for callers that
need `json.dumps`'s keyword arguments (the Flask JSON provider of `http_json`, the tiny engine):
every JSON reply body of every server of this project goes through one of the two.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

try:  # pragma: no cover - which branch runs depends on the environment
    if os.environ.get("SLIME_EXT_JSON", "").lower() == "stdlib":
        raise ImportError("SLIME_EXT_JSON=stdlib")
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

__all__ = ["BACKEND", "STRICT_DECODER", "dumps", "dumps_text", "finite", "loads"]

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


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +inf, -inf, numpy floats included) in it, at any
    depth of dicts, lists and tuples, replaced by None; other values are returned as they are
    (containers that hold no non-finite float come back unchanged, not copied)."""
    if isinstance(obj, float) or (getattr(getattr(obj, "dtype", None), "kind", "") == "f" and obj.ndim == 0):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        items = {k: finite(v) for k, v in obj.items()}
        return obj if all(items[k] is v for k, v in obj.items()) else items
    if isinstance(obj, list | tuple):
        values = [finite(v) for v in obj]
        return obj if all(a is b for a, b in zip(values, obj, strict=True)) else values
    return obj


def dumps_text(obj: Any, *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """`json.dumps(obj, **kwargs)` in standard JSON only: non-finite floats become null (also
    in what `default` returns), never NaN/Infinity. No cost when there is none to replace."""
    fallback = None if default is None else (lambda o: finite(default(o)))
    try:
        return json.dumps(obj, allow_nan=False, default=fallback, **kwargs)
    except ValueError:  # a non-finite float somewhere (or a circular reference: raised again)
        return json.dumps(finite(obj), allow_nan=False, default=fallback, **kwargs)


def dumps(obj: Any) -> bytes:
    """Encode as compact UTF-8 JSON bytes; non-finite floats are written as null."""
    if _orjson is not None:
        return _orjson.dumps(obj)  # writes null for NaN and the infinities
    return dumps_text(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
