"""POST /trajectories: store one record or a batch, sent as JSON or packed by the writer.

Three ways in, one reply: packed bodies (codec.pack_request) are validated and stored as they
are, JSON bodies take the fast path (store/ingest.py) when it can decide, else the full
parser (`parse_record`) with its field-by-field errors.
"""

from __future__ import annotations

from flask import Response, request

from buffer_server.api.bodies import json_object, read_body
from buffer_server.api.context import ApiContext
from buffer_server.store.results import PutResult
from krl_common import fastjson
from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.trajectory.codec import PACKED_MEDIA_TYPE
from slime_ext.trajectory.record import parse_record

__all__ = ["MAX_RECORDS_PER_REQUEST", "put_trajectories"]

MAX_RECORDS_PER_REQUEST = 4096


def put_trajectories(ctx: ApiContext) -> tuple[Response, int]:
    """Store the records all or none; the reply counts accepted, duplicate and stale ones."""
    raw = read_body(ctx.max_body_bytes)
    if request.mimetype == PACKED_MEDIA_TYPE:  # records packed by the writer (codec.pack_request)
        return _put_reply(ctx.store.put_encoded(ctx.unpack_packed(raw, MAX_RECORDS_PER_REQUEST)))
    encoded = ctx.encode_body(raw, MAX_RECORDS_PER_REQUEST)  # None: the full path decides
    if encoded is not None:
        return _put_reply(ctx.store.put_encoded(encoded))
    body = json_object(raw, 'with a record, or {"records": [...]}')
    if "records" in body:
        reject_unknown("", body, {"records"})
        items = body["records"]
        check_type("records", items, list)
        if not items:
            raise ValidationError("records: must not be empty")
        if len(items) > MAX_RECORDS_PER_REQUEST:
            raise ValidationError(f"records: more than {MAX_RECORDS_PER_REQUEST} records in one request")
        records = [
            parse_record(item, path=f"records[{i}]", strict_json=fastjson.STRICT_DECODER)
            for i, item in enumerate(items)
        ]
    else:
        records = [parse_record(body, strict_json=fastjson.STRICT_DECODER)]
    return _put_reply(ctx.store.put(records))


def _put_reply(result: PutResult) -> tuple[Response, int]:
    # built directly: Flask's jsonify costs as much GIL time as a packed record's commit
    body = b'{"accepted":%d,"duplicates":%d,"stale":%d}' % (
        result.accepted,
        result.duplicates,
        result.stale,
    )
    return Response(body, mimetype="application/json"), 200
