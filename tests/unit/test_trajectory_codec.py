"""Unit tests of slime_ext.trajectory.codec: the packed body gives back, byte for byte, the JSON of the
record it was made from (the served wire format), for every log-prob encoding it chooses, and
it refuses arrays that break the record's per-token invariants."""

from __future__ import annotations

import array
import random

import numpy as np
import pytest

from krl_common import fastjson
from slime_ext.trajectory import codec
from slime_ext.trajectory.record import parse_record

pytestmark = pytest.mark.unit


def make(n: int = 64, *, seed: int = 0, **overrides) -> dict:
    rng = random.Random(seed)
    mask = [rng.randrange(2) for _ in range(n)]
    # float32-valued, as SGLang returns them
    logps = array.array("f", [-abs(rng.gauss(0, 2)) if m else 0.0 for m in mask]).tolist()
    data = {
        "uid": f"u-{seed}",
        "instance_id": "level1/19_ReLU",
        "policy_version": 3,
        "prompt_token_ids": [rng.randrange(151_936) for _ in range(17)],
        "response_token_ids": [rng.randrange(151_936) for _ in range(n)],
        "loss_mask": mask,
        "rollout_log_probs": logps,
        "turn_rewards": [0.0, 1.25],
        "turn_eval_results": [None, {"status": "ok", "feedback": "Status: ok. é ✓", "trials": [{"seed": 1}]}],
        "reward": 0.75,
        "status": "completed",
        "metadata": {"gen_s": [1.5, 2.0], "nested": {"a": [1, 2, {"b": None}]}},
        "created_at": 1_800_000_000.25,
        "sample_index": 2,
    }
    data.update(overrides)
    return data


def roundtrip(data: dict) -> tuple[bytes, codec.EncodedRecord]:
    record = parse_record(data)
    packed = codec.encode(record)
    assert codec.to_json(packed.body) == fastjson.dumps(record.to_json())
    assert codec.decode(packed.body) == record
    return packed.body, packed


def kind(body: bytes) -> int:
    return body[4]


def test_float32_log_probs_are_packed_small_and_come_back_exactly() -> None:
    body, packed = roundtrip(make(4096))
    assert kind(body) == codec.LP_SAMPLED_F32
    assert len(body) < len(fastjson.dumps(make(4096))) / 2.5
    assert (packed.uid, packed.instance_id, packed.policy_version, packed.reward) == (
        "u-0",
        "level1/19_ReLU",
        3,
        0.75,
    )


def test_float64_log_probs_are_kept_in_full() -> None:
    data = make(32)
    data["rollout_log_probs"] = [-0.1 if m else 0.0 for m in data["loss_mask"]]  # 0.1 is no float32
    body, _ = roundtrip(data)
    assert kind(body) == codec.LP_SAMPLED_F64


def test_minus_zero_where_the_mask_is_zero_survives() -> None:
    data = make(8)
    data["loss_mask"] = [1, 0, 1, 0, 1, 1, 0, 1]
    data["rollout_log_probs"] = [-0.5, -0.0, -0.25, 0.0, -0.0, -1.0, -0.0, -2.0]
    body, _ = roundtrip(data)
    assert kind(body) == codec.LP_ALL_F64
    assert b'"rollout_log_probs":[-0.5,-0.0,-0.25,0.0,-0.0,-1.0,-0.0,-2.0]' in codec.to_json(body)


@pytest.mark.parametrize(
    "overrides",
    [
        {"response_token_ids": [], "loss_mask": [], "rollout_log_probs": []},
        {"loss_mask": [0] * 64, "rollout_log_probs": [0.0] * 64},
        {
            "rollout_log_probs": [-3.4028234663852886e38 if i % 2 else 0.0 for i in range(64)],
            "loss_mask": [i % 2 for i in range(64)],
        },  # fmt: skip
        {"prompt_token_ids": [0, 2**32 - 1]},
        {"metadata": {}, "turn_rewards": [], "turn_eval_results": []},
    ],
)
def test_edge_records_round_trip(overrides: dict) -> None:
    roundtrip(make(64, **overrides))


def test_integer_log_probs_and_rewards_are_served_as_floats_like_parse_record_makes_them() -> None:
    data = make(4, loss_mask=[1, 0, 1, 1], rollout_log_probs=[-1, 0, -2, -3], reward=1, turn_rewards=[0, 1])
    body, _ = roundtrip(data)
    assert b'"rollout_log_probs":[-1.0,0.0,-2.0,-3.0]' in codec.to_json(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt", [-1, 2]),
        ("prompt", [2**32]),
        ("prompt", []),
        ("response", [5, -3, 1]),
        ("mask", [1, 2, 0]),
        ("mask", [1, 0]),
        ("log_probs", [-1.0, 0.5, -1.0]),  # non-zero where the mask is 0
        ("log_probs", [-1.0, 0.0, float("nan")]),
    ],
)
def test_arrays_that_break_the_invariants_are_refused(field: str, value: list) -> None:
    arrays = {
        "prompt": [1, 2],
        "response": [5, 6, 7],
        "mask": [1, 0, 1],
        "log_probs": [-1.0, 0.0, -2.0],
        field: value,
    }
    fields = {k: v for k, v in make(3).items() if k not in codec.ARRAY_FIELDS}
    with pytest.raises(ValueError):
        codec.encode_arrays(
            fields,
            np.array(arrays["prompt"], dtype=np.int64),
            np.array(arrays["response"], dtype=np.int64),
            np.array(arrays["mask"], dtype=np.int64),
            np.array(arrays["log_probs"], dtype=np.float64),
        )


def test_a_foreign_body_is_refused() -> None:
    with pytest.raises(ValueError, match="magic"):
        codec.to_json(b"{" * 64)


# ----------------------------------------------------------------------- packed uploads


def test_packed_request_round_trip_gives_the_canonical_bodies() -> None:
    records = [parse_record(make(64, seed=s)) for s in range(3)]
    out = codec.unpack_request(codec.pack_request(records), 16)
    assert [o.body for o in out] == [codec.encode(r).body for r in records]
    assert [(o.uid, o.instance_id, o.policy_version, o.reward) for o in out] == [
        (r.uid, r.instance_id, r.policy_version, r.reward) for r in records
    ]


def _with_body(body: bytes) -> bytes:
    return codec.REQUEST_MAGIC + (1).to_bytes(4, "little") + len(body).to_bytes(4, "little") + body


def test_packed_request_framing_errors_are_named() -> None:
    good = codec.pack_request([parse_record(make(8))])
    cases = [
        (b"", "shorter than its header"),
        (b"XXXX" + good[4:], "bad magic"),
        (good[:4] + (0).to_bytes(4, "little") + good[8:], "expected 1 to 16 records, got 0"),
        (good[:-1], "records[0]: packed body ends inside this record"),
        (good + b"\0", "1 bytes after the last record"),
        (_with_body(b"TRB1"), "records[0]: not a valid packed record"),
    ]
    for raw, message in cases:
        with pytest.raises(codec.ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
            codec.unpack_request(raw, 16)


def test_packed_request_checks_fields_and_arrays_like_json() -> None:
    # a small field that parse_record refuses: the error names the record and the field
    body = codec.encode(parse_record(make(8))).body.replace(b'"status":"completed"', b'"status":"finished!"')
    with pytest.raises(codec.ValidationError, match=r"records\[0\]\.status"):
        codec.unpack_request(_with_body(body), 16)
    # a NaN log-prob written straight into the packed arrays
    packed = bytearray(codec.encode(parse_record(make(8, seed=1))).body)
    packed[-4:] = np.array([np.nan], dtype="<f4").tobytes()
    with pytest.raises(codec.ValidationError, match=r"records\[0\]: .*log-prob is not finite"):
        codec.unpack_request(_with_body(bytes(packed)), 16)
    # an unknown field smuggled into the packed fields
    body = codec.encode(parse_record(make(8))).body
    hacked = body.replace(b'"sample_index":2}', b'"sample_index":2,"x":1}')
    head = codec._HEADER.unpack_from(hacked)
    hacked = codec._HEADER.pack(*head[:5], head[5] + 6) + hacked[codec._HEADER.size :]
    with pytest.raises(codec.ValidationError, match=r"unexpected field\(s\) \['x'\]"):
        codec.unpack_request(_with_body(hacked), 16)


def test_packed_mask_padding_bits_must_be_zero() -> None:
    """The mask's last byte has 8 - n % 8 padding bits; a set one would be a token beyond the
    response (and would shift the log-prob count): refused, not stored."""
    body = bytearray(codec.encode(parse_record(make(13, seed=2))).body)
    at = codec._layout(bytes(body))
    body[at.values_at - 1] |= 1  # the last padding bit
    with pytest.raises(codec.ValidationError, match="bits set beyond the response"):
        codec.unpack_request(_with_body(bytes(body)), 16)


def test_packed_fields_are_stored_canonically_whatever_the_writer_sent() -> None:
    """The float32 fast path keeps the arrays byte for byte but writes the fields' JSON again
    from the validated values: spacing and an integer reward come out as `encode` writes them."""
    record = parse_record(make(40, seed=3, reward=1.0))
    canonical = codec.encode(record).body
    at = codec._layout(canonical)
    assert canonical[4] == codec.LP_SAMPLED_F32
    head = canonical[codec._HEADER.size : codec._HEADER.size + at.n_head]
    tail = canonical[codec._HEADER.size + at.n_head : at.ids_at]
    loose_head = head.replace(b",", b", ")
    loose_tail = tail.replace(b'"reward":1.0', b'"reward": 1')
    assert loose_tail != tail
    header = codec._HEADER.pack(
        codec.MAGIC, codec.LP_SAMPLED_F32, at.n_prompt, at.n_response, len(loose_head), len(loose_tail)
    )
    loose = header + loose_head + loose_tail + canonical[at.ids_at :]
    (out,) = codec.unpack_request(_with_body(loose), 16)
    assert out.body == canonical
    assert codec.decode(out.body) == record


def test_packed_batch_round_trip_and_framing_errors() -> None:
    bodies = [[codec.encode(parse_record(make(n, seed=n))).body for n in (3, 5)], [], [b"x" * 7]]
    header = {"lease_id": "L", "groups": [{"instance_id": i} for i in "abc"], "meta": {"num_records": 3}}
    raw = b"".join(codec.pack_batch(header, bodies))
    got_header, got = codec.unpack_batch(raw)
    assert got == bodies and got_header["lease_id"] == "L"
    assert [g["num_records"] for g in got_header["groups"]] == [2, 0, 1]
    assert codec.decode(got[0][1]) == parse_record(make(5, seed=5))
    with pytest.raises(ValueError, match="ends inside a record of groups\\[2\\]"):
        codec.unpack_batch(raw[:-1])
    with pytest.raises(ValueError, match="1 bytes after the last record"):
        codec.unpack_batch(raw + b"!")
    with pytest.raises(ValueError, match="bad magic"):
        codec.unpack_batch(b"TRQ1" + raw[4:])
    with pytest.raises(ValueError, match="not a valid packed record"):
        codec.decode(got[2][0])
    with pytest.raises(ValueError, match="describe each group"):
        codec.pack_batch({"groups": []}, bodies)
