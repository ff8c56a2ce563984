"""The stored form of a trajectory record: a compact binary body, turned back into the record's
JSON only when it is handed out.

Why binary: a 4k-token record is ~118 kB of JSON, ~70 % of it log-probability digits. Stored as
JSON, 2000 records/s would be ~240 MB/s of fsynced writes (twice that through SQLite's WAL),
more than the development VM's disk sustains. Packed, the same record is ~40 kB: token ids as
uint32, the loss mask as bits, and the log-probs of the sampled tokens only (the others are
0.0 by the record's invariants), as float32 when every value is exactly a float32 (SGLang's are)
and as float64 otherwise. Nothing is lost: `to_json(body)` returns exactly the bytes of
`fastjson.dumps(record.to_json())` (the served wire format is unchanged).

Layout (little-endian): header `<4sBIIII` = magic, log-prob kind, len(prompt), len(response),
len(head), len(tail); then `head` (the JSON of uid, instance_id and policy_version, without the
closing brace), `tail` (the JSON of every later field, without the opening brace), prompt ids,
response ids (uint32 each), the loss mask (numpy.packbits), the log-probs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from krl_common import fastjson
from krl_common.validation import ValidationError
from slime_ext.trajectory.record import MAX_TOKEN_ID, TrajectoryRecord, parse_record

__all__ = [
    "ARRAY_FIELDS",
    "ARRAY_STAND_INS",
    "PACKED_BATCH_MEDIA_TYPE",
    "PACKED_MEDIA_TYPE",
    "EncodedRecord",
    "SplicedRecord",
    "decode",
    "encode",
    "encode_arrays",
    "pack_batch",
    "pack_request",
    "splice",
    "to_json",
    "unpack_batch",
    "unpack_request",
    "validate_request",
]

MAGIC = b"TRB1"
_HEADER = struct.Struct("<4sBIIII")
LP_SAMPLED_F32 = 1  # log-probs of the mask-1 tokens, float32; the rest are +0.0
LP_SAMPLED_F64 = 2  # same, float64 (a value that is not exactly a float32)
LP_ALL_F64 = 3  # every log-prob, float64 (keeps a -0.0 where the mask is 0)
_HEAD_FIELDS = ("uid", "instance_id", "policy_version")
_TAIL_FIELDS = (
    "turn_rewards",
    "turn_eval_results",
    "reward",
    "status",
    "metadata",
    "created_at",
    "sample_index",
)
ARRAY_FIELDS = ("prompt_token_ids", "response_token_ids", "loss_mask", "rollout_log_probs")
# The record's JSON field order is the dataclass's: head fields, the four arrays, tail fields.
assert tuple(TrajectoryRecord.__dataclass_fields__) == _HEAD_FIELDS + ARRAY_FIELDS + _TAIL_FIELDS

try:  # pragma: no cover - depends on the environment, like fastjson
    import orjson as _orjson

    _NUMPY_OPT = _orjson.OPT_SERIALIZE_NUMPY
except ImportError:  # pragma: no cover
    _orjson = None


@dataclass(frozen=True)
class EncodedRecord:
    """What the store needs of one validated record: its index columns and its packed body."""

    uid: str
    instance_id: str
    policy_version: int
    reward: float
    body: bytes


def _dump_array(values: np.ndarray) -> bytes:
    if fastjson.BACKEND == "orjson" and _orjson is not None:
        return _orjson.dumps(values, option=_NUMPY_OPT)
    return fastjson.dumps(values.tolist())


def _dump_mask(sampled: np.ndarray) -> bytes:
    """`[1,0,...]` built as one byte array (5x faster than a JSON encoder)."""
    if not len(sampled):
        return b"[]"
    out = np.full(2 * len(sampled) + 1, ord(","), dtype=np.uint8)
    out[0], out[-1] = ord("["), ord("]")
    out[1::2] = sampled + ord("0")
    return out.tobytes()


def encode_arrays(
    fields: dict[str, Any],
    prompt: np.ndarray,
    response: np.ndarray,
    mask: np.ndarray,
    log_probs: np.ndarray,
) -> EncodedRecord:
    """Pack one record. `fields` holds every non-array field, validated by `parse_record`, with
    defaults filled in; the arrays (integer ids and mask, float64 log-probs) are checked here,
    vectorised, against the record's per-token invariants (ValueError if one does not hold)."""
    n = len(response)
    if not len(prompt) or len(mask) != n or len(log_probs) != n:
        raise ValueError("array lengths do not match the record's invariants")
    # As uint64 a negative id is huge, so one max() checks both ends of the range.
    if prompt.view(np.uint64).max() > MAX_TOKEN_ID or (n and response.view(np.uint64).max() > MAX_TOKEN_ID):
        raise ValueError(f"a token id is outside [0, {MAX_TOKEN_ID}]")
    if n and mask.view(np.uint64).max() > 1:
        raise ValueError("a loss_mask value is not 0 or 1")
    sampled = mask.astype(bool)
    unsampled = log_probs[~sampled]
    if unsampled.any() or not np.isfinite(log_probs).all():
        raise ValueError("a log-prob is not finite, or not 0.0 where loss_mask is 0")
    lp = log_probs[sampled]
    if np.signbit(unsampled).any():  # a -0.0 where the mask is 0: keep it, store every value
        kind, lp = LP_ALL_F64, log_probs
    else:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, then not equal
            lp32 = lp.astype(np.float32)
        kind = LP_SAMPLED_F32 if np.array_equal(lp32, lp) else LP_SAMPLED_F64  # keeps -0.0 too
        if kind == LP_SAMPLED_F32:
            lp = lp32
    arrays = (
        prompt.astype("<u4").tobytes(),
        response.astype("<u4").tobytes(),
        np.packbits(sampled).tobytes(),
        lp.tobytes(),
    )
    return _encoded(fields, kind, len(prompt), n, arrays)


def _prefix(fields: dict[str, Any], kind: int, n_prompt: int, n_response: int) -> bytes:
    """What comes before a body's arrays: the header and the fields' JSON (written from the
    validated values, so it is canonical)."""
    head = fastjson.dumps({name: fields[name] for name in _HEAD_FIELDS})[:-1]
    tail = fastjson.dumps({name: fields[name] for name in _TAIL_FIELDS})[1:]
    return b"".join((_HEADER.pack(MAGIC, kind, n_prompt, n_response, len(head), len(tail)), head, tail))


def _encoded(
    fields: dict[str, Any], kind: int, n_prompt: int, n_response: int, arrays: tuple[bytes | memoryview, ...]
) -> EncodedRecord:
    """The record with its body: the prefix, then the packed arrays."""
    return EncodedRecord(
        uid=fields["uid"],
        instance_id=fields["instance_id"],
        policy_version=fields["policy_version"],
        reward=fields["reward"],
        body=b"".join((_prefix(fields, kind, n_prompt, n_response), *arrays)),
    )


def encode(record: TrajectoryRecord) -> EncodedRecord:
    """Pack a record built in Python (the in-process writer's path); its small fields are
    trusted to be valid (build it with `parse_record`), its arrays are checked."""
    fields = {name: getattr(record, name) for name in _HEAD_FIELDS + _TAIL_FIELDS}
    fields["reward"] = float(fields["reward"])
    fields["turn_rewards"] = [float(r) for r in fields["turn_rewards"]]
    return encode_arrays(
        fields,
        np.array(record.prompt_token_ids, dtype=np.int64),
        np.array(record.response_token_ids, dtype=np.int64),
        np.array(record.loss_mask, dtype=np.int64),
        np.array(record.rollout_log_probs, dtype=np.float64),
    )


@dataclass(frozen=True)
class _Layout:
    """Where the parts of a packed body are; every length is checked against the body's size."""

    kind: int
    n_prompt: int
    n_response: int
    n_head: int
    n_tail: int
    ids_at: int  # offset of the prompt ids; the fields' JSON lies between the header and here
    bits_at: int  # offset of the packed loss mask
    values_at: int  # offset of the log-probs


def _layout(body: bytes | memoryview) -> _Layout:
    """The layout of a packed body (uploads are untrusted): ValueError if its header does not
    fit its size."""
    if len(body) < _HEADER.size:
        raise ValueError("shorter than the record header")
    magic, kind, n_prompt, n_response, n_head, n_tail = _HEADER.unpack_from(body)
    if magic != MAGIC:
        raise ValueError(f"not a packed trajectory record (magic {magic!r})")
    if kind not in (LP_SAMPLED_F32, LP_SAMPLED_F64, LP_ALL_F64):
        raise ValueError(f"unknown log-prob encoding {kind}")
    ids_at = _HEADER.size + n_head + n_tail
    bits_at = ids_at + 4 * (n_prompt + n_response)
    values_at = bits_at + (n_response + 7) // 8
    if values_at > len(body):
        raise ValueError("lengths in the header do not match the body")
    return _Layout(kind, n_prompt, n_response, n_head, n_tail, ids_at, bits_at, values_at)


def _mask_bits(body: bytes | memoryview, at: _Layout) -> np.ndarray:
    """The loss mask as one uint8 per bit of its packed bytes (padding bits included)."""
    return np.unpackbits(
        np.frombuffer(body, dtype=np.uint8, count=at.values_at - at.bits_at, offset=at.bits_at)
    )


def _values(body: bytes | memoryview, at: _Layout, n_sampled: int) -> np.ndarray:
    count = at.n_response if at.kind == LP_ALL_F64 else n_sampled
    dtype = "<f4" if at.kind == LP_SAMPLED_F32 else "<f8"
    if len(body) != at.values_at + count * np.dtype(dtype).itemsize:
        raise ValueError("log-prob count does not match the loss mask and the body")
    return np.frombuffer(body, dtype=dtype, count=count, offset=at.values_at)


def _unpack(body: bytes | memoryview) -> tuple[bytes, bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The parts of a packed body, ValueError if one does not fit."""
    at = _layout(body)
    view = memoryview(body)
    head = bytes(view[_HEADER.size : _HEADER.size + at.n_head])
    tail = bytes(view[_HEADER.size + at.n_head : at.ids_at])
    prompt = np.frombuffer(body, dtype="<u4", count=at.n_prompt, offset=at.ids_at)
    response = np.frombuffer(body, dtype="<u4", count=at.n_response, offset=at.ids_at + 4 * at.n_prompt)
    sampled = _mask_bits(body, at)[: at.n_response]
    values = _values(body, at, int(sampled.sum()))
    if at.kind == LP_ALL_F64:
        log_probs = values
    else:
        log_probs = np.zeros(at.n_response, dtype=np.float64)
        log_probs[sampled.view(bool)] = values
    return head, tail, prompt, response, sampled, log_probs


def to_json(body: bytes) -> bytes:
    """The record's JSON, byte for byte what `fastjson.dumps(record.to_json())` gives."""
    head, tail, prompt, response, sampled, log_probs = _unpack(body)
    return b"".join(
        (
            head,
            b',"prompt_token_ids":',
            _dump_array(prompt),
            b',"response_token_ids":',
            _dump_array(response),
            b',"loss_mask":',
            _dump_mask(sampled),
            b',"rollout_log_probs":',
            _dump_array(log_probs),
            b",",
            tail,
        )
    )


def decode(body: bytes) -> TrajectoryRecord:
    """The record back as a TrajectoryRecord, equal to `parse_record` of its JSON (the trainer's
    reader of packed batches). The small fields go through `parse_record`; the arrays need no
    per-element check (uint32 ids, mask bits and 0.0 unsampled log-probs are valid by layout)."""
    try:
        head, tail, prompt, response, sampled, log_probs = _unpack(body)
        small = fastjson.loads(head + b"," + tail)
    except ValueError as exc:
        raise ValueError(f"not a valid packed record ({exc})") from None
    if not isinstance(small, dict) or not set(small) <= _SMALL_FIELDS:
        raise ValueError("not a valid packed record (its fields are not the record's)")
    record = parse_record({**small, **ARRAY_STAND_INS}, strict_json=fastjson.STRICT_DECODER)
    record.prompt_token_ids = prompt.tolist()
    record.response_token_ids = response.tolist()
    record.loss_mask = sampled.tolist()
    record.rollout_log_probs = log_probs.tolist()
    return record


# --------------------------------------------------------------------------- packed uploads

# `POST /trajectories` also accepts records already packed by the writer, with this media type:
# `<4sI` = REQUEST_MAGIC and the record count, then per record a `<I` byte length and the packed
# body (the layout above). A 4k-token record is ~41 kB instead of ~118 kB of JSON and the
# server reads its arrays with numpy instead of parsing ~13k JSON numbers. The server checks
# every field exactly as for JSON (the small fields through `parse_record`, the arrays against
# the record's invariants) and stores the canonical re-packed form, so what it serves is the
# same whichever way a record came in.
PACKED_MEDIA_TYPE = "application/vnd.kernel-rl.trajectories+packed"
REQUEST_MAGIC = b"TRQ1"
_REQUEST_HEADER = struct.Struct("<4sI")
_LENGTH = struct.Struct("<I")
_SMALL_FIELDS = frozenset(_HEAD_FIELDS + _TAIL_FIELDS)
# parse_record checks every other field; these stand-ins satisfy its checks of the arrays,
# which the packed layout and the vectorised checks here (or in ingest.py) cover instead.
ARRAY_STAND_INS: dict[str, list[Any]] = {
    "prompt_token_ids": [0],
    "response_token_ids": [],
    "loss_mask": [],
    "rollout_log_probs": [],
}


def _count(raw: bytes, magic: bytes, what: str, error: type[ValueError]) -> int:
    """The count field of the `<4sI` header that starts a packed upload or batch reply."""
    if len(raw) < _REQUEST_HEADER.size:
        raise error(f"{what}: shorter than its header")
    found, count = _REQUEST_HEADER.unpack_from(raw)
    if found != magic:
        raise error(f"{what}: bad magic {found!r} (expected {magic!r})")
    return count


def _framed(bodies: list[bytes]) -> list[bytes]:
    """Each body after its `<I` byte length."""
    pieces: list[bytes] = []
    for body in bodies:
        pieces += [_LENGTH.pack(len(body)), body]
    return pieces


def _frame(raw: bytes, at: int, error: type[ValueError], before: str, inside: str) -> tuple[int, int]:
    """(start, end) of the length-prefixed body at `at`; `error(before)` if even its length
    is cut off, `error(inside)` if the body is."""
    if at + _LENGTH.size > len(raw):
        raise error(before)
    (n,) = _LENGTH.unpack_from(raw, at)
    start = at + _LENGTH.size
    if start + n > len(raw):
        raise error(inside)
    return start, start + n


def _check_end(raw: bytes, at: int, what: str, error: type[ValueError]) -> None:
    if at != len(raw):
        raise error(f"{what}: {len(raw) - at} bytes after the last record")


def pack_request(records: list[TrajectoryRecord] | list[EncodedRecord]) -> bytes:
    """The body of a packed `POST /trajectories` (the client side; records are packed with
    `encode`, which checks their arrays)."""
    bodies = [r.body if isinstance(r, EncodedRecord) else encode(r).body for r in records]
    return b"".join([_REQUEST_HEADER.pack(REQUEST_MAGIC, len(bodies)), *_framed(bodies)])


@dataclass(frozen=True)
class SplicedRecord:
    """A validated record of a packed upload whose stored body is `prefix + raw[start:end]`,
    `raw` being the upload's bytes: the arrays stay where they lie, so an ingest worker process
    sends back only the few kB of `prefix`, not the record (start == end: prefix is the body)."""

    uid: str
    instance_id: str
    policy_version: int
    reward: float
    prefix: bytes
    start: int
    end: int

    def encoded(self, raw: bytes | memoryview) -> EncodedRecord:
        body = b"".join((self.prefix, raw[self.start : self.end])) if self.end > self.start else self.prefix
        return EncodedRecord(self.uid, self.instance_id, self.policy_version, self.reward, body)


def unpack_request(raw: bytes, max_records: int) -> list[EncodedRecord]:
    """Validate a packed `POST /trajectories` body; ValidationError names the record and field."""
    return splice(raw, validate_request(raw, max_records))


def splice(raw: bytes, records: list[SplicedRecord]) -> list[EncodedRecord]:
    """The records `validate_request(raw, ...)` returned, with their bodies."""
    view = memoryview(raw)
    return [r.encoded(view) for r in records]


def validate_request(raw: bytes, max_records: int) -> list[SplicedRecord]:
    """`unpack_request` without building the bodies (what an ingest worker returns)."""
    count = _count(raw, REQUEST_MAGIC, "packed body", ValidationError)
    if not 1 <= count <= max_records:
        raise ValidationError(f"records: expected 1 to {max_records} records, got {count}")
    out: list[SplicedRecord] = []
    view = memoryview(raw)
    at = _REQUEST_HEADER.size
    for i in range(count):
        path = f"records[{i}]"
        start, at = _frame(
            raw,
            at,
            ValidationError,
            f"{path}: packed body ends before this record",
            f"{path}: packed body ends inside this record",
        )
        out.append(_validate_packed(view[start:at], start, path))
    _check_end(raw, at, "packed body", ValidationError)
    return out


def _validate_packed(body: memoryview, offset: int, path: str) -> SplicedRecord:
    """One record of an upload; `body` lies at `offset` in the upload."""
    try:
        at = _layout(body)
        head = bytes(body[_HEADER.size : _HEADER.size + at.n_head])
        tail = bytes(body[_HEADER.size + at.n_head : at.ids_at])
        if not head.startswith(b"{") or not tail.endswith(b"}"):
            raise ValueError("field JSON is not framed as an object")
    except ValueError as exc:
        raise ValidationError(f"{path}: not a valid packed record ({exc})") from None
    try:
        small = fastjson.loads(head + b"," + tail)
    except ValueError as exc:
        raise ValidationError(f"{path}: its fields are not valid JSON ({exc})") from None
    if not isinstance(small, dict) or not set(small) <= _SMALL_FIELDS:
        extra = sorted(set(small) - _SMALL_FIELDS) if isinstance(small, dict) else small
        raise ValidationError(f"{path}: unexpected field(s) {extra} beside the packed arrays")
    record = parse_record({**small, **ARRAY_STAND_INS}, path=path, strict_json=fastjson.STRICT_DECODER)
    fields = {name: getattr(record, name) for name in _SMALL_FIELDS}
    index = (fields["uid"], fields["instance_id"], fields["policy_version"], fields["reward"])
    try:
        if at.kind == LP_SAMPLED_F32:
            _check_in_place(body, at)
            prefix = _prefix(fields, LP_SAMPLED_F32, at.n_prompt, at.n_response)
            return SplicedRecord(*index, prefix, offset + at.ids_at, offset + len(body))
        # float64 log-probs: unpacked and packed again, which picks the canonical encoding
        _, _, prompt, response, sampled, log_probs = _unpack(body)
        encoded = encode_arrays(
            fields, prompt.astype(np.int64), response.astype(np.int64), sampled.astype(np.int64), log_probs
        )
        return SplicedRecord(*index, encoded.body, 0, 0)
    except ValueError as exc:
        raise ValidationError(f"{path}: {exc}") from None


def _check_in_place(body: memoryview, at: _Layout) -> None:
    """A float32-log-prob body is checked where it lies (the writers' usual case): its arrays
    are kept byte for byte, only the fields' JSON is written again from the validated values,
    so the stored body is what `encode_arrays` makes of the same record, at a fifth of its CPU.
    Token ids need no check (uint32 is MAX_TOKEN_ID's range) and unsampled log-probs are 0.0
    by construction; what is left: the mask's padding bits and finite log-probs."""
    if at.n_prompt == 0:
        raise ValueError("prompt_token_ids: must not be empty")
    bits = _mask_bits(body, at)
    if bits[at.n_response :].any():
        raise ValueError("the packed loss mask has bits set beyond the response")
    if not np.isfinite(_values(body, at, int(bits.sum()))).all():
        raise ValueError("a log-prob is not finite, or not 0.0 where loss_mask is 0")


# --------------------------------------------------------------------------- packed batch replies

# `POST /batches` answers with this media type when the request's Accept header asks for it:
# `<4sI` = BATCH_MAGIC and the byte length of a JSON header {"lease_id", "groups":
# [{"instance_id", "num_records"}], "meta"} (the JSON reply without the records), the header,
# then the records of every group in order, each as a `<I` byte length and its packed body.
# The server sends the stored bodies as they lie; the reader unpacks them with `decode` instead
# of building and parsing ~30 MB of JSON per 32-group batch.
PACKED_BATCH_MEDIA_TYPE = "application/vnd.kernel-rl.batch+packed"
BATCH_MAGIC = b"TRL1"


def pack_batch(header: dict[str, Any], groups: list[list[bytes]]) -> list[bytes]:
    """The pieces of a packed batch reply (sent without joining them); `header["groups"][i]`
    describes `groups[i]`, whose `num_records` this fills in."""
    if len(header.get("groups", ())) != len(groups):
        raise ValueError("the header must describe each group")
    for described, bodies in zip(header["groups"], groups, strict=True):
        described["num_records"] = len(bodies)
    head = fastjson.dumps(header)
    return [
        _REQUEST_HEADER.pack(BATCH_MAGIC, len(head)),
        head,
        *_framed([b for bodies in groups for b in bodies]),
    ]


def unpack_batch(raw: bytes) -> tuple[dict[str, Any], list[list[bytes]]]:
    """The header and the packed bodies, per group, of a packed batch reply (ValueError if its
    framing or record counts do not add up)."""
    at = _REQUEST_HEADER.size + _count(raw, BATCH_MAGIC, "packed batch", ValueError)
    header = fastjson.loads(raw[_REQUEST_HEADER.size : at])
    if not isinstance(header, dict) or not isinstance(header.get("groups"), list):
        raise ValueError("packed batch: its header has no group list")
    view = memoryview(raw)
    groups: list[list[bytes]] = []
    for g, described in enumerate(header["groups"]):
        count = described.get("num_records") if isinstance(described, dict) else None
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"packed batch: groups[{g}] has no record count")
        bodies = []
        for _ in range(count):
            start, at = _frame(
                raw,
                at,
                ValueError,
                f"packed batch: ends inside groups[{g}]",
                f"packed batch: ends inside a record of groups[{g}]",
            )
            bodies.append(bytes(view[start:at]))
        groups.append(bodies)
    _check_end(raw, at, "packed batch", ValueError)
    return header, groups
