"""The batch hand-out: POST /batches leases whole groups and streams them, POST /batches/ack
consumes a lease, POST /batches/release gives it back.

A batch reply is streamed from the records' stored JSON bytes without decoding them, so a
batch of 256 records of 5k tokens costs no JSON encode and no 30 MB concatenation.
"""

from __future__ import annotations

from typing import Any

from flask import Response, jsonify, request

from buffer_server.api.bodies import json_fields
from buffer_server.api.context import ApiContext
from buffer_server.store.results import Lease
from krl_common import fastjson
from krl_common.validation import check_int_range, check_number_range, check_type
from slime_ext.trajectory.codec import PACKED_BATCH_MEDIA_TYPE, pack_batch

__all__ = ["MAX_GROUPS_PER_BATCH", "MAX_LEASE_S", "ack_batch", "get_batch", "release_batch"]

MAX_GROUPS_PER_BATCH = 4096
MAX_LEASE_S = 86_400.0


def get_batch(ctx: ApiContext) -> Response:
    """Lease up to `num_groups` whole groups, waiting up to `timeout_s`; JSON unless the reader
    accepts the packed batch type."""
    body = json_fields(
        'like {"num_groups": 32, "timeout_s": 60}',
        {"num_groups", "timeout_s", "policy_version", "lease_s"},
        required=("num_groups",),
    )
    num_groups = check_int_range("num_groups", body["num_groups"], 1, MAX_GROUPS_PER_BATCH)
    timeout_s = check_number_range("timeout_s", body.get("timeout_s", 0.0), 0.0, ctx.max_wait_s)
    version = body.get("policy_version")
    if version is not None:
        version = check_int_range("policy_version", version, 0, 2**62)
    lease_s = body.get("lease_s")
    if lease_s is not None:
        lease_s = check_number_range("lease_s", lease_s, 1e-3, MAX_LEASE_S)
    # Packed records only for a reader that asks for them (slime_ext's BufferClient does).
    packed = (
        request.accept_mimetypes.best_match(["application/json", PACKED_BATCH_MEDIA_TYPE])
        == PACKED_BATCH_MEDIA_TYPE
    )
    lease = ctx.store.lease(
        num_groups, timeout_s=timeout_s, lease_s=lease_s, policy_version=version, packed=packed
    )
    meta = {
        "num_groups": len(lease.groups),
        "num_records": lease.num_records,
        "requested_groups": num_groups,
        "waited_s": round(lease.waited_s, 4),
        "policy_version": lease.policy_version,
        "lease_expires_at": lease.expires_at,
    }
    # The reply is streamed from the stored record bytes with a known Content-Length: no
    # 30 MB join, and waitress sends while later pieces are still being handed over.
    if packed:
        return _stream(_packed_pieces(lease, meta), PACKED_BATCH_MEDIA_TYPE)
    return _stream(_json_pieces(lease, meta), "application/json")


def _packed_pieces(lease: Lease, meta: dict[str, Any]) -> list[bytes]:
    header = {
        "lease_id": lease.lease_id,
        "groups": [{"instance_id": g.instance_id} for g in lease.groups],
        "meta": meta,
    }
    return pack_batch(header, [g.records for g in lease.groups])


def _json_pieces(lease: Lease, meta: dict[str, Any]) -> list[bytes]:
    """The JSON reply `{"lease_id", "groups": [{"instance_id", "records"}], "meta"}` in pieces,
    the records' stored JSON bytes among them as they are."""
    pieces = [b'{"lease_id":', fastjson.dumps(lease.lease_id), b',"groups":[']
    for i, group in enumerate(lease.groups):
        pieces.append(b'{"instance_id":' if i == 0 else b',{"instance_id":')
        pieces += [fastjson.dumps(group.instance_id), b',"records":[']
        for j, body in enumerate(group.records):
            if j:
                pieces.append(b",")
            pieces.append(body)
        pieces.append(b"]}")
    pieces += [b'],"meta":', fastjson.dumps(meta), b"}"]
    return pieces


def _stream(pieces: list[bytes], mimetype: str) -> Response:
    size = sum(len(p) for p in pieces)
    return Response(iter(pieces), status=200, mimetype=mimetype, headers={"Content-Length": str(size)})


def _lease_id() -> str:
    body = json_fields('like {"lease_id": "..."}', {"lease_id"}, required=("lease_id",))
    check_type("lease_id", body["lease_id"], str)
    return body["lease_id"]


def ack_batch(ctx: ApiContext) -> tuple[Response, int]:
    """Consume a lease's groups; a retried ack is answered again (`already_acked`)."""
    result = ctx.store.ack(_lease_id())
    return jsonify(
        lease_id=result.lease_id,
        groups=result.groups,
        records=result.records,
        already_acked=result.already,
    ), 200


def release_batch(ctx: ApiContext) -> tuple[Response, int]:
    """Give a lease's groups back to the buffer now instead of at its expiry."""
    lease_id = _lease_id()
    return jsonify(lease_id=lease_id, records_released=ctx.store.release(lease_id)), 200
