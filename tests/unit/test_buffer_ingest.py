"""Unit tests of buffer_server.store.ingest, the simdjson fast path of POST /trajectories: it packs
exactly what `parse_record` + `codec.encode` pack for valid bodies, and it accepts nothing that
`parse_record` rejects (it answers None, and the full path then names the field)."""

from __future__ import annotations

import pytest

from buffer_server.store import ingest
from krl_common import fastjson
from slime_ext.trajectory import codec
from slime_ext.trajectory.record import ValidationError, parse_record
from tests.unit.test_trajectory_codec import make

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not ingest.AVAILABLE, reason="pysimdjson is not installed (the fast path is optional)"
    ),
]


def slow_path(body: dict) -> list[codec.EncodedRecord]:
    if not isinstance(body, dict):
        raise ValidationError("body: expected a JSON object")  # as the app says
    items = body.get("records", [body])
    return [codec.encode(parse_record(item, strict_json=fastjson.STRICT_DECODER)) for item in items]


@pytest.mark.parametrize(
    "body",
    [
        make(4096),
        {"records": [make(300, seed=s) for s in range(8)]},
        make(16, response_token_ids=[], loss_mask=[], rollout_log_probs=[]),
        make(4, loss_mask=[1, 0, 1, 1], rollout_log_probs=[-1, 0, -2.5, -3]),  # ints for floats
        make(4, loss_mask=[1, 0, 1, 1], rollout_log_probs=[-0.1, -0.0, -2.5, -3.0]),
        {k: v for k, v in make(8).items() if k not in ("metadata", "sample_index")},  # defaults
    ],
)
def test_valid_bodies_are_packed_like_the_full_path(body: dict) -> None:
    if "records" not in body:
        body.setdefault("created_at", 1.0)  # else each path stamps its own time
    fast = ingest.encode_body(fastjson.dumps(body), 4096)
    assert fast is not None
    assert fast == slow_path(body)


def invalid_bodies() -> list[tuple[str, bytes]]:
    def rec(**overrides) -> dict:
        return make(
            4, **{"loss_mask": [1, 0, 1, 1], "rollout_log_probs": [-1.0, 0.0, -2.0, -0.5], **overrides}
        )

    cases = {
        "bool token": rec(prompt_token_ids=[1, True]),
        "float token": rec(response_token_ids=[1, 2, 3.0, 4]),
        "negative token": rec(response_token_ids=[1, 2, -3, 4]),
        "token above uint32": rec(prompt_token_ids=[2**32]),
        "huge token": rec(prompt_token_ids=[2**64 - 1]),
        "empty prompt": rec(prompt_token_ids=[]),
        "mask 2": rec(loss_mask=[1, 0, 2, 1]),
        "mask bool": rec(loss_mask=[1, False, 1, 1]),
        "mask short": rec(loss_mask=[1, 0, 1]),
        "log-prob where mask is 0": rec(rollout_log_probs=[-1.0, -0.5, -2.0, -0.5]),
        "log-prob null": rec(rollout_log_probs=[-1.0, None, -2.0, -0.5]),
        "log-probs long": rec(rollout_log_probs=[-1.0, 0.0, -2.0, -0.5, -1.0]),
        "string reward": rec(reward="1"),
        "bad status": rec(status="done"),
        "unknown field": rec(extra=1),
        "eval results length": rec(turn_eval_results=[None]),
        "tokens not a list": rec(prompt_token_ids={"a": 1}),
        "empty uid": rec(uid=" "),
        "wrapper with extra key": {"records": [rec()], "x": 1},
        "empty records": {"records": []},
        "records not a list": {"records": rec()},
        "record not an object": {"records": [rec(), [1]]},
    }
    missing = rec()
    del missing["loss_mask"]
    cases["missing field"] = missing
    bodies = [(name, fastjson.dumps(body)) for name, body in cases.items()]
    dup = fastjson.dumps(rec())
    bodies.append(("duplicate key", dup[:-1] + b',"reward":"x"}'))
    bodies.append(("not JSON", b'{"uid": '))
    bodies.append(("NaN", fastjson.dumps(rec()).replace(b'"reward":0.75', b'"reward":NaN')))
    bodies.append(("not an object", b"[1, 2]"))
    bodies.append(("empty", b""))
    return bodies


@pytest.mark.parametrize(("name", "raw"), invalid_bodies(), ids=[n for n, _ in invalid_bodies()])
def test_anything_the_full_path_rejects_goes_to_the_full_path(name: str, raw: bytes) -> None:
    assert ingest.encode_body(raw, 4096) is None
    with pytest.raises((ValidationError, ValueError, TypeError, KeyError)):
        body = fastjson.loads(raw)
        if name == "duplicate key":  # the decoders keep the last value, which is invalid here
            assert body["reward"] == "x"
        slow_path(body)
        if "records" in body:  # the wrapper rules live in the app (tested over HTTP)
            raise ValidationError("wrapper")


def test_too_many_records_go_to_the_full_path() -> None:
    raw = fastjson.dumps({"records": [make(4, seed=s) for s in range(3)]})
    assert ingest.encode_body(raw, 2) is None
    assert ingest.encode_body(raw, 3) is not None


def test_the_worker_pool_packs_the_same() -> None:
    body = {"records": [make(64, seed=s) for s in range(3)]}
    raw = fastjson.dumps(body)
    pool = ingest.IngestPool(1)
    try:
        assert pool.encode_body(raw, 4096) == ingest.encode_body(raw, 4096) == slow_path(body)
        assert pool.encode_body(b"[", 4096) is None
        # packed uploads: the same canonical bodies, and a ValidationError comes back with its message
        packed = codec.pack_request([parse_record(r) for r in body["records"]])
        assert pool.unpack_request(packed, 4096) == codec.unpack_request(packed, 4096) == slow_path(body)
        with pytest.raises(ValidationError, match=r"records\[2\]: packed body ends inside this record"):
            pool.unpack_request(packed[:-1], 4096)
    finally:
        pool.close()


def test_a_dead_worker_is_replaced_and_its_request_encoded_in_process() -> None:
    body = {"records": [make(32, seed=s) for s in range(2)]}
    raw = fastjson.dumps(body)
    pool = ingest.IngestPool(1)
    try:
        pool.warm_up()
        (worker,) = pool._all
        worker.proc.kill()
        worker.proc.join(timeout=10)
        assert pool.encode_body(raw, 16) == slow_path(body)  # in-process, after the failed send
        (replacement,) = pool._all
        assert replacement is not worker and replacement.proc.is_alive()
        assert pool.encode_body(raw, 16) == slow_path(body)  # served by the new worker
    finally:
        pool.close()
    assert not replacement.proc.is_alive()
