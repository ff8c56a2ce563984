"""HTTP layer over BufferStore: validation, status codes, stats and Prometheus metrics.

Thin on purpose: every decision about storage and groups lives in `store.py`, and the record
schema in `slime_ext/trajectory/record.py`. Errors are JSON `{"error": "..."}` whose text names what
was wrong (field, record index, size, JSON syntax). A rejected write stores nothing.

A batch reply is streamed from the records' stored JSON bytes without decoding them, so a
batch of 256 records of 5k tokens costs no JSON encode and no 30 MB concatenation.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from buffer_server.runner.agent_runner import AgentRunner, runner_prometheus
from buffer_server.store import ingest
from buffer_server.store.buffer_store import (
    DROP_REASONS,
    DROP_STALE,
    BufferStore,
    LeaseError,
    PolicyVersionError,
    PutResult,
)
from krl_common import fastjson
from krl_common import prometheus as prom
from krl_common.http_json import json_flask_app
from krl_common.validation import ValidationError
from krl_common.validation import check_type as _check_type
from krl_common.validation import reject_unknown as _reject_unknown
from slime_ext.trajectory.codec import (
    PACKED_BATCH_MEDIA_TYPE,
    PACKED_MEDIA_TYPE,
    EncodedRecord,
    pack_batch,
    unpack_request,
)
from slime_ext.trajectory.record import parse_record

log = logging.getLogger("buffer_server.app")

DEFAULT_MAX_BODY_BYTES = 64 << 20  # 64 MiB: ~500 records with 5k tokens each
MAX_RECORDS_PER_REQUEST = 4096
MAX_GROUPS_PER_BATCH = 4096
MAX_LEASE_S = 86_400.0
DEFAULT_MAX_WAIT_S = 600.0
NO_RUNNER = (
    "no agent runner is configured: start the buffer server with --recipe PATH (a recipe YAML with a "
    "kernel_rl.runner section) or the runner flags (--prompt-data, --sglang-url, --eval-urls, --tokenizer); "
    "without it, write trajectories with POST /trajectories"
)


def _check_number(path: str, value: Any, lo: float, hi: float) -> float:
    _check_type(path, value, (int, float))
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and lo <= number <= hi):
        raise ValidationError(f"{path}: must be a number in [{lo:g}, {hi:g}]")
    return number


def _check_int(path: str, value: Any, lo: int, hi: int) -> int:
    _check_type(path, value, int)
    if not lo <= value <= hi:
        raise ValidationError(f"{path}: must be an integer in [{lo}, {hi}]")
    return int(value)


def _json_object(raw: bytes, hint: str) -> dict[str, Any]:
    if not raw:
        raise ValidationError(f"empty body: send a JSON object {hint}")
    try:
        body = fastjson.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValidationError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValidationError(f"body: expected a JSON object {hint}, got {type(body).__name__}")
    return body


def create_app(
    store: BufferStore,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    info: dict[str, Any] | None = None,
    runner: AgentRunner | None = None,
    encode_body: Callable[[bytes, int], list[EncodedRecord] | None] = ingest.encode_body,
    unpack_packed: Callable[[bytes, int], list[EncodedRecord]] = unpack_request,
) -> Flask:
    """`encode_body` is the fast path of POST /trajectories for JSON bodies (ingest.py),
    `unpack_packed` the validator of packed ones (slime_ext/trajectory/codec.py); an
    IngestPool's run them in worker processes."""
    app = json_flask_app("buffer_server", max_body_bytes)
    server_info = dict(info or {})

    @app.errorhandler(ValidationError)
    def _invalid(exc: ValidationError) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 400

    @app.errorhandler(PolicyVersionError)
    def _bad_version(exc: PolicyVersionError) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 400

    @app.errorhandler(LeaseError)
    def _lease_error(exc: LeaseError) -> tuple[Response, int]:
        return jsonify(error=str(exc)), exc.code

    @app.errorhandler(sqlite3.Error)
    def _storage_error(exc: sqlite3.Error) -> tuple[Response, int]:
        log.exception("storage error")
        resp = jsonify(error=f"storage error, nothing of this request was stored or changed: {exc}")
        resp.headers["Retry-After"] = "5"
        return resp, 503

    @app.errorhandler(Exception)
    def _internal(exc: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return jsonify(error=f"internal error: {type(exc).__name__}: {exc}"), 500

    def _request_bytes() -> bytes:
        """The request body in one read (werkzeug's get_data reads in 64 kB pieces: ~0.3 ms of
        CPU per MB). Over the limit: 413."""
        length = request.content_length
        if length is not None and length > max_body_bytes:
            raise RequestEntityTooLarge()
        stream = request.environ["wsgi.input"]
        if request.environ.get("wsgi.input_terminated"):  # waitress: the stream ends with the body
            data = stream.read(max_body_bytes + 1)
            if len(data) > max_body_bytes:
                raise RequestEntityTooLarge()
        elif length is None:
            return request.get_data(cache=False)
        else:
            data = stream.read(length)
        if length is not None and len(data) != length:
            raise BadRequest(f"request body ended after {len(data)} of {length} bytes")
        return data

    @app.post("/trajectories")
    def put_trajectories() -> tuple[Response, int]:
        raw = _request_bytes()
        if request.mimetype == PACKED_MEDIA_TYPE:  # records packed by the writer (codec.pack_request)
            return _put_reply(store.put_encoded(unpack_packed(raw, MAX_RECORDS_PER_REQUEST)))
        encoded = encode_body(raw, MAX_RECORDS_PER_REQUEST)  # None: the full path decides
        if encoded is not None:
            return _put_reply(store.put_encoded(encoded))
        body = _json_object(raw, 'with a record, or {"records": [...]}')
        if "records" in body:
            _reject_unknown("", body, {"records"})
            items = body["records"]
            _check_type("records", items, list)
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
        return _put_reply(store.put(records))

    def _put_reply(result: PutResult) -> tuple[Response, int]:
        # built directly: Flask's jsonify costs as much GIL time as a packed record's commit
        body = b'{"accepted":%d,"duplicates":%d,"stale":%d}' % (
            result.accepted,
            result.duplicates,
            result.stale,
        )
        return Response(body, mimetype="application/json"), 200

    @app.post("/batches")
    def get_batch() -> Response:
        body = _json_object(request.get_data(cache=False), 'like {"num_groups": 32, "timeout_s": 60}')
        _reject_unknown("", body, {"num_groups", "timeout_s", "policy_version", "lease_s"})
        if "num_groups" not in body:
            raise ValidationError("num_groups: missing required field")
        num_groups = _check_int("num_groups", body["num_groups"], 1, MAX_GROUPS_PER_BATCH)
        timeout_s = _check_number("timeout_s", body.get("timeout_s", 0.0), 0.0, max_wait_s)
        version = body.get("policy_version")
        if version is not None:
            version = _check_int("policy_version", version, 0, 2**62)
        lease_s = body.get("lease_s")
        if lease_s is not None:
            lease_s = _check_number("lease_s", lease_s, 1e-3, MAX_LEASE_S)
        # Packed records only for a reader that asks for them (slime_ext's BufferClient does).
        packed = (
            request.accept_mimetypes.best_match(["application/json", PACKED_BATCH_MEDIA_TYPE])
            == PACKED_BATCH_MEDIA_TYPE
        )
        lease = store.lease(
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
            header = {
                "lease_id": lease.lease_id,
                "groups": [{"instance_id": g.instance_id} for g in lease.groups],
                "meta": meta,
            }
            pieces = pack_batch(header, [g.records for g in lease.groups])
            return _stream(pieces, PACKED_BATCH_MEDIA_TYPE)
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
        return _stream(pieces, "application/json")

    def _stream(pieces: list[bytes], mimetype: str) -> Response:
        size = sum(len(p) for p in pieces)
        return Response(iter(pieces), status=200, mimetype=mimetype, headers={"Content-Length": str(size)})

    def _lease_id() -> str:
        body = _json_object(request.get_data(cache=False), 'like {"lease_id": "..."}')
        _reject_unknown("", body, {"lease_id"})
        if "lease_id" not in body:
            raise ValidationError("lease_id: missing required field")
        _check_type("lease_id", body["lease_id"], str)
        return body["lease_id"]

    @app.post("/batches/ack")
    def ack_batch() -> tuple[Response, int]:
        result = store.ack(_lease_id())
        return jsonify(
            lease_id=result.lease_id,
            groups=result.groups,
            records=result.records,
            already_acked=result.already,
        ), 200

    @app.post("/batches/release")
    def release_batch() -> tuple[Response, int]:
        lease_id = _lease_id()
        return jsonify(lease_id=lease_id, records_released=store.release(lease_id)), 200

    @app.post("/policy_version")
    def policy_version() -> tuple[Response, int]:
        body = _json_object(request.get_data(cache=False), 'like {"version": 3}')
        _reject_unknown("", body, {"version"})
        if "version" not in body:
            raise ValidationError("version: missing required field")
        version = _check_int("version", body["version"], 0, 2**62)
        dropped = store.set_policy_version(version)
        return jsonify(policy_version=store.policy_version, dropped_stale=dropped), 200

    def _empty_body(hint: str) -> None:
        raw = request.get_data(cache=False)
        if raw.strip():
            _reject_unknown("", _json_object(raw, hint), set())

    @app.post("/rollout/start")
    def rollout_start() -> tuple[Response, int]:
        _empty_body("(empty: {})")
        if runner is None:
            return jsonify(error=NO_RUNNER), 409
        started = runner.start()
        return jsonify(running=True, started=started), 200

    @app.post("/rollout/stop")
    def rollout_stop() -> tuple[Response, int]:
        _empty_body("(empty: {})")
        if runner is None:
            return jsonify(running=False, configured=False), 200
        runner.stop()
        return jsonify(running=runner.running), 200

    @app.get("/health")
    def health() -> tuple[Response, int]:
        try:
            mode = store.pragma("journal_mode")
        except sqlite3.Error as exc:
            return jsonify(status="error", error=f"database not usable: {exc}", **server_info), 503
        body = {
            "status": "ok",
            "db": str(store.path),
            "journal_mode": mode,
            "policy_version": store.policy_version,
            "json_backend": fastjson.BACKEND,
            **server_info,
        }
        return jsonify(body), 200

    @app.get("/stats")
    def stats() -> tuple[Response, int]:
        runner_stats = runner.stats() if runner is not None else {"configured": False, "running": False}
        return jsonify({**server_info, **store.stats(), "runner": runner_stats}), 200

    @app.get("/metrics")
    def metrics() -> Response:
        text = render_prometheus(store.stats())
        if runner is not None:
            text += runner_prometheus(runner.stats())
        return Response(text, mimetype="text/plain; version=0.0.4")

    return app


def render_prometheus(stats: dict[str, Any]) -> str:
    """Prometheus text exposition of BufferStore.stats() (no client library needed)."""
    rec, groups, leases = stats["records"], stats["groups"], stats["leases"]
    outcomes = (
        ("accepted", "total"),
        ("duplicate", "duplicates"),
        ("consumed", "consumed"),
        ("redelivered", "redelivered"),
    )
    return prom.render(
        prom.family(
            "rollout_buffer_records",
            "Records held now, by state.",
            "gauge",
            [({"state": state}, rec[state]) for state in ("ready", "leased")],
        )
        + prom.family(
            "rollout_buffer_groups",
            "Pending groups, by state (ready = can be handed out now).",
            "gauge",
            [({"state": state}, groups[state]) for state in ("ready", "partial")],
        )
        + prom.family(
            "rollout_buffer_records_total",
            "Records by outcome since the database was created.",
            "counter",
            [({"outcome": outcome}, rec[key]) for outcome, key in outcomes],
        )
        + prom.family(
            "rollout_buffer_dropped_records_total",
            "Records dropped by a group rule, by reason.",
            "counter",
            [({"reason": reason}, stats["dropped_records"][reason]) for reason in DROP_REASONS],
        )
        + prom.family(
            "rollout_buffer_dropped_groups_total",
            "Whole groups dropped, by reason.",
            "counter",
            [({"reason": r}, stats["dropped_groups"][r]) for r in DROP_REASONS if r != DROP_STALE],
        )
        + prom.scalars(
            "counter",
            {
                "rollout_buffer_groups_leased_total": (
                    "Groups handed out (redeliveries included).",
                    groups["leased_total"],
                ),
                "rollout_buffer_groups_consumed_total": ("Groups acked by a reader.", groups["consumed"]),
                "rollout_buffer_leases_expired_total": (
                    "Leases that expired without an ack.",
                    leases["expired"],
                ),
                "rollout_buffer_leases_released_total": (
                    "Leases given back by their reader.",
                    leases["released"],
                ),
                "rollout_buffer_write_commits_total": (
                    "Transactions that stored writes (group commit: one may hold several requests), since start.",
                    stats["write_commits"],
                ),
            },
        )
        + prom.scalars(
            "gauge",
            {
                "rollout_buffer_leases_active": ("Leases waiting for an ack.", leases["active"]),
                "rollout_buffer_policy_version": (
                    "Current policy (weights) version.",
                    stats["policy_version"],
                ),
                "rollout_buffer_write_rate": (
                    f"Records accepted per second over the last {stats['write_rate_window_s']:g} s.",
                    stats["writes_per_s_recent"],
                ),
            },
        )
    )
