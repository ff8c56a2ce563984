"""Unit tests of eval_server.app.render_prometheus on hand-built WorkerPool.snapshot() dicts."""

from __future__ import annotations

import re

import pytest

from eval_server.app import render_prometheus
from eval_server.schema import STATUSES

pytestmark = pytest.mark.unit


def snapshot(**overrides):
    """Same keys as WorkerPool.snapshot()."""
    snap = {
        "workers": 4,
        "workers_ready": 3,
        "worker_start_errors": [],
        "in_flight": 2,
        "queued": 5,
        "max_queue": 64,
        "evaluations": 17,
        "by_status": {"ok": 10, "incorrect": 4, "rejected": 3},
        "by_check": {"static.try_except": 2, "runtime.no_launch": 1},
        "worker_restarts": 1,
        "rejected_queue_full": 6,
        "latency_s": {"mean": 1.5, "p50": 1.25, "p95": 3.5},
        "per_worker": [
            {
                "id": 0,
                "device": "cpu",
                "alive": True,
                "pid": 123,
                "evaluations": 17,
                "restarts": 1,
                "versions": {},
            }
        ],
        "uptime_s": 12.5,
    }
    snap.update(overrides)
    return snap


def samples(text: str) -> dict[str, str]:
    """metric{labels} -> value for every non-comment line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = value
    return out


def test_full_snapshot_values():
    text = render_prometheus(snapshot())
    got = samples(text)
    assert got['kernel_eval_evaluations_total{status="ok"}'] == "10"
    assert got['kernel_eval_evaluations_total{status="incorrect"}'] == "4"
    assert got['kernel_eval_evaluations_total{status="rejected"}'] == "3"
    assert got['kernel_eval_checks_total{check="static.try_except"}'] == "2"
    assert got['kernel_eval_checks_total{check="runtime.no_launch"}'] == "1"
    assert got["kernel_eval_workers"] == "4"
    assert got["kernel_eval_workers_ready"] == "3"
    assert got["kernel_eval_in_flight"] == "2"
    assert got["kernel_eval_queued"] == "5"
    assert got["kernel_eval_worker_restarts_total"] == "1"
    assert got["kernel_eval_queue_full_total"] == "6"
    assert got['kernel_eval_latency_seconds{quantile="0.5"}'] == "1.250000"
    assert got['kernel_eval_latency_seconds{quantile="0.95"}'] == "3.500000"


def test_every_status_has_a_line_zero_when_absent():
    got = samples(render_prometheus(snapshot(by_status={})))
    for status in STATUSES:
        assert got[f'kernel_eval_evaluations_total{{status="{status}"}}'] == "0"
    assert sum(k.startswith("kernel_eval_evaluations_total{") for k in got) == len(STATUSES)


def test_status_lines_follow_statuses_order():
    text = render_prometheus(snapshot())
    found = re.findall(r'^kernel_eval_evaluations_total\{status="([a-z_]+)"\}', text, re.M)
    assert found == list(STATUSES)


def test_checks_sorted_and_absent_when_none():
    text = render_prometheus(snapshot(by_check={"z.check": 1, "a.check": 2}))
    found = re.findall(r'^kernel_eval_checks_total\{check="([^"]+)"\} (\d+)$', text, re.M)
    assert found == [("a.check", "2"), ("z.check", "1")]
    assert "kernel_eval_checks_total{" not in render_prometheus(snapshot(by_check={}))
    assert "# TYPE kernel_eval_checks_total counter" in render_prometheus(snapshot(by_check={}))


def test_latency_quantiles_omitted_without_data():
    text = render_prometheus(snapshot(latency_s={"mean": None, "p50": None, "p95": None}))
    assert "kernel_eval_latency_seconds{" not in text
    assert "# TYPE kernel_eval_latency_seconds summary" in text


def test_help_and_type_for_every_metric():
    text = render_prometheus(snapshot())
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types == {
        "kernel_eval_evaluations_total": "counter",
        "kernel_eval_checks_total": "counter",
        "kernel_eval_requests_rejected_total": "counter",
        "kernel_eval_workers": "gauge",
        "kernel_eval_workers_ready": "gauge",
        "kernel_eval_in_flight": "gauge",
        "kernel_eval_queued": "gauge",
        "kernel_eval_worker_restarts_total": "counter",
        "kernel_eval_queue_full_total": "counter",
        "kernel_eval_latency_seconds": "summary",
    }
    helps = set(re.findall(r"^# HELP (\S+) .+$", text, re.M))
    assert helps == set(types)
    # every sample belongs to a declared metric, and HELP/TYPE come before its samples
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        assert name in types
        assert lines.index(f"# TYPE {name} {types[name]}") < i
        assert lines.index(f"# TYPE {name} {types[name]}") - 1 == next(
            j for j, x in enumerate(lines) if x.startswith(f"# HELP {name} ")
        )


def test_exposition_format_shape():
    text = render_prometheus(snapshot())
    assert text.endswith("\n") and not text.endswith("\n\n")
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r'[a-z_]+(\{[a-z]+="[^"]*"\})? -?[0-9.]+', line), line


def test_fresh_pool_snapshot():
    fresh = snapshot(
        workers=2,
        workers_ready=0,
        in_flight=0,
        queued=0,
        evaluations=0,
        by_status={},
        by_check={},
        worker_restarts=0,
        rejected_queue_full=0,
        latency_s={"mean": None, "p50": None, "p95": None},
        per_worker=[],
    )
    got = samples(render_prometheus(fresh))
    assert got["kernel_eval_workers"] == "2"
    assert got["kernel_eval_workers_ready"] == "0"
    assert set(got.values()) == {"0", "2"}
