"""What the buffer service reports about itself: GET /health (is the database usable),
GET /stats (the store's and the runner's counts as JSON), GET /metrics (the same as
Prometheus text).

Separate from the routes that change state: these only read.
"""

from __future__ import annotations

import sqlite3

from flask import Response, jsonify

from buffer_server.api.context import ApiContext
from buffer_server.api.metrics import render_prometheus
from buffer_server.runner.metrics import runner_prometheus
from krl_common import fastjson

__all__ = ["health", "metrics", "stats"]


def health(ctx: ApiContext) -> tuple[Response, int]:
    """200 while the database answers (launchers wait for it), 503 when it does not."""
    try:
        mode = ctx.store.pragma("journal_mode")
    except sqlite3.Error as exc:
        return jsonify(status="error", error=f"database not usable: {exc}", **ctx.info), 503
    body = {
        "status": "ok",
        "db": str(ctx.store.path),
        "journal_mode": mode,
        "policy_version": ctx.store.policy_version,
        "json_backend": fastjson.BACKEND,
        **ctx.info,
    }
    return jsonify(body), 200


def stats(ctx: ApiContext) -> tuple[Response, int]:
    """The store's counts (the group rules applied first) and the runner's."""
    runner_stats = ctx.runner.stats() if ctx.runner is not None else {"configured": False, "running": False}
    return jsonify({**ctx.info, **ctx.store.stats(), "runner": runner_stats}), 200


def metrics(ctx: ApiContext) -> Response:
    """/stats as Prometheus text."""
    text = render_prometheus(ctx.store.stats())
    if ctx.runner is not None:
        text += runner_prometheus(ctx.runner.stats())
    return Response(text, mimetype="text/plain; version=0.0.4")
