"""HTTP layer over WorkerPool: validation, status codes, stats and Prometheus metrics.

Thin on purpose: every decision about evaluation lives in the pool and the worker. Errors are
JSON `{"error": "..."}` whose text names what was wrong (field, size, JSON syntax).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from flask import Flask, Response, jsonify, request

from eval_server.schema import STATUSES, ValidationError, parse_request
from eval_server.workers.pool import QueueFullError, WorkerPool, WorkerUnavailableError
from krl_common import prometheus as prom
from krl_common.http_json import json_flask_app

log = logging.getLogger("eval_server.app")
DEFAULT_MAX_BODY_BYTES = 1 << 20
# Status codes of POST /eval answers that refuse the request itself (400 malformed, 413 too
# large): always listed in /stats and /metrics, zero or not, so a dashboard sees the series.
REJECT_CODES = (400, 413)


class RejectCounter:
    """POST /eval requests refused before evaluation, by HTTP status code (thread-safe).

    They never reach the pool, so its counts miss them; a client sending broken bodies would
    otherwise be invisible in /stats and /metrics.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = dict.fromkeys(REJECT_CODES, 0)

    def add(self, code: int) -> None:
        with self._lock:
            self._counts[code] = self._counts.get(code, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {str(code): n for code, n in sorted(self._counts.items())}


def create_app(
    pool: WorkerPool, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, info: dict[str, Any] | None = None
) -> Flask:
    app = json_flask_app("eval_server", max_body_bytes)
    server_info = dict(info or {})
    rejected = RejectCounter()

    @app.after_request
    def count_rejections(response: Response) -> Response:
        # after_request also sees the 413 that the body-size limit raises before the route runs.
        if request.path == "/eval" and request.method == "POST" and 400 <= response.status_code < 500:
            rejected.add(response.status_code)
        return response

    @app.post("/eval")
    def eval_route() -> tuple[Response, int]:
        raw = request.get_data(cache=False)
        if not raw:
            return jsonify(error="empty body: send a JSON object with 'reference' and 'candidate'"), 400
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return jsonify(error=f"body is not valid JSON: {exc}"), 400
        try:
            eval_request = parse_request(body)
        except ValidationError as exc:
            return jsonify(error=str(exc)), 400
        try:
            result = pool.evaluate(eval_request)
        except QueueFullError as exc:
            resp = jsonify(error=f"queue full: {exc}; retry later")
            resp.headers["Retry-After"] = "5"
            return resp, 503
        except WorkerUnavailableError as exc:
            resp = jsonify(error=f"no evaluation worker available: {exc}")
            resp.headers["Retry-After"] = "30"
            return resp, 503
        return jsonify(result.to_json()), 200

    @app.get("/health")
    def health() -> tuple[Response, int]:
        snap = pool.snapshot()
        ready = snap["workers_ready"] > 0 and any(w["alive"] for w in snap["per_worker"])
        body = {
            "status": "ok" if ready else "starting",
            "workers": snap["workers"],
            "workers_ready": snap["workers_ready"],
            "start_errors": snap["worker_start_errors"][-3:],
            **server_info,
        }
        return jsonify(body), 200 if ready else 503

    @app.get("/stats")
    def stats() -> tuple[Response, int]:
        return jsonify({**server_info, **pool.snapshot(), "rejected_requests": rejected.snapshot()}), 200

    @app.get("/metrics")
    def metrics() -> Response:
        snap = {**pool.snapshot(), "rejected_requests": rejected.snapshot()}
        return Response(render_prometheus(snap), mimetype="text/plain; version=0.0.4")

    return app


def render_prometheus(snap: dict[str, Any]) -> str:
    """Prometheus text exposition of a pool snapshot (no client library needed)."""
    lat = snap["latency_s"]
    return prom.render(
        prom.family(
            "kernel_eval_evaluations_total",
            "Evaluations finished, by result status.",
            "counter",
            [({"status": status}, snap["by_status"].get(status, 0)) for status in STATUSES],
        )
        + prom.family(
            "kernel_eval_checks_total",
            "Anti-cheat checks that fired, by check id.",
            "counter",
            [({"check": check}, n) for check, n in sorted(snap["by_check"].items())],
        )
        + prom.family(
            "kernel_eval_requests_rejected_total",
            "POST /eval requests refused before evaluation, by HTTP status (400 malformed, 413 too large).",
            "counter",
            [({"code": code}, n) for code, n in snap.get("rejected_requests", {}).items()],
        )
        + prom.scalars(
            "gauge",
            {
                "kernel_eval_workers": ("Configured workers.", snap["workers"]),
                "kernel_eval_workers_ready": ("Workers that finished start-up.", snap["workers_ready"]),
                "kernel_eval_in_flight": ("Evaluations running now.", snap["in_flight"]),
                "kernel_eval_queued": ("Requests waiting for a worker.", snap["queued"]),
            },
        )
        + prom.scalars(
            "counter",
            {
                "kernel_eval_worker_restarts_total": (
                    "Workers replaced after a crash or hang.",
                    snap["worker_restarts"],
                ),
                "kernel_eval_queue_full_total": (
                    "Requests refused with 503 because the queue was full.",
                    snap["rejected_queue_full"],
                ),
            },
        )
        + prom.family(
            "kernel_eval_latency_seconds",
            "Recent evaluation latency quantiles.",
            "summary",
            [
                ({"quantile": q}, f"{lat[key]:.6f}")
                for q, key in (("0.5", "p50"), ("0.95", "p95"))
                if lat[key] is not None
            ],
        )
    )
