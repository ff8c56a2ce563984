"""HTTP layer over BufferStore: validation, status codes, stats and Prometheus metrics.

Thin on purpose: every decision about storage and groups lives in `store/`, and the record
schema in `slime_ext/trajectory/record.py`. Errors are JSON `{"error": "..."}` whose text names what
was wrong (field, record index, size, JSON syntax). A rejected write stores nothing.

This module only assembles the app: the route table below says which handler answers what,
and the handlers, their request checks and the error replies live in `buffer_server/api/`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import Flask

from buffer_server.api import batches, control, status, trajectories
from buffer_server.api.context import ApiContext
from buffer_server.api.errors import register_error_handlers
from buffer_server.runner.agent_runner import AgentRunner
from buffer_server.store import ingest
from buffer_server.store.buffer_store import BufferStore
from krl_common.http_json import json_flask_app
from slime_ext.trajectory.codec import EncodedRecord, unpack_request

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_WAIT_S", "ROUTES", "create_app"]

DEFAULT_MAX_BODY_BYTES = 64 << 20  # 64 MiB: ~500 records with 5k tokens each
DEFAULT_MAX_WAIT_S = 600.0

# (method, rule, handler): each handler takes the ApiContext; its name is the Flask endpoint.
ROUTES: tuple[tuple[str, str, Callable[[ApiContext], Any]], ...] = (
    ("POST", "/trajectories", trajectories.put_trajectories),
    ("POST", "/batches", batches.get_batch),
    ("POST", "/batches/ack", batches.ack_batch),
    ("POST", "/batches/release", batches.release_batch),
    ("POST", "/policy_version", control.policy_version),
    ("POST", "/rollout/start", control.rollout_start),
    ("POST", "/rollout/stop", control.rollout_stop),
    ("GET", "/health", status.health),
    ("GET", "/stats", status.stats),
    ("GET", "/metrics", status.metrics),
)


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
    ctx = ApiContext(
        store=store,
        max_body_bytes=max_body_bytes,
        max_wait_s=max_wait_s,
        encode_body=encode_body,
        unpack_packed=unpack_packed,
        runner=runner,
        info=dict(info or {}),
    )
    register_error_handlers(app)
    for method, rule, handler in ROUTES:
        app.add_url_rule(rule, handler.__name__, functools.partial(handler, ctx), methods=[method])
    return app
