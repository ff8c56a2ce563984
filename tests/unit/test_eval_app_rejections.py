"""eval_server/app.py counts the POST /eval requests it refuses (400, 413) in /stats and /metrics.

Those never reach the worker pool, so without this a client sending broken bodies is invisible.
The pool is a stand-in: only the HTTP layer is under test.
"""

from __future__ import annotations

from typing import Any

import pytest

from eval_server.app import create_app

pytestmark = pytest.mark.unit


class _IdlePool:
    """A pool that never evaluates: every request in this test is refused before it."""

    def evaluate(self, request: Any) -> Any:
        raise AssertionError("a refused request reached the pool")

    def snapshot(self) -> dict[str, Any]:
        return {
            "workers": 1,
            "workers_ready": 1,
            "in_flight": 0,
            "queued": 0,
            "worker_restarts": 0,
            "rejected_queue_full": 0,
            "by_status": {},
            "by_check": {},
            "latency_s": {"p50": None, "p95": None},
            "per_worker": [],
            "worker_start_errors": [],
        }


def test_400_and_413_are_counted_by_status_code() -> None:
    client = create_app(_IdlePool(), max_body_bytes=1000).test_client()  # type: ignore[arg-type]
    stats = client.get("/stats").get_json()
    assert stats["rejected_requests"] == {"400": 0, "413": 0}
    assert 'kernel_eval_requests_rejected_total{code="413"} 0' in client.get("/metrics").text

    assert client.post("/eval", data=b"{not json").status_code == 400
    assert client.post("/eval", data=b"").status_code == 400
    assert client.post("/eval", json={"candidate": "x"}).status_code == 400  # missing reference
    too_large = client.post("/eval", data=b"x" * 5000, content_type="application/json")
    assert too_large.status_code == 413 and "too large" in too_large.get_json()["error"]
    assert client.get("/nope").status_code == 404  # not a refused evaluation: not counted

    assert client.get("/stats").get_json()["rejected_requests"] == {"400": 3, "413": 1}
    metrics = client.get("/metrics").text
    assert "# TYPE kernel_eval_requests_rejected_total counter" in metrics
    assert 'kernel_eval_requests_rejected_total{code="400"} 3' in metrics
    assert 'kernel_eval_requests_rejected_total{code="413"} 1' in metrics
