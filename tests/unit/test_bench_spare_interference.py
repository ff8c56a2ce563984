"""bench/spare_interference_probe.py's bookkeeping on CPU: the interferer's fork loop reports
each child's windows (preparation swapped for sleeps: no CUDA here), and timings are classified
by what overlapped them."""

from __future__ import annotations

import json
import time

import pytest

from bench import spare_interference_probe as probe
from eval_server.workers import child_prep


def test_interferer_reports_each_childs_windows_in_order(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_prep, "create_context", lambda device: time.sleep(0.05))
    monkeypatch.setattr(child_prep, "launch_first_kernels", lambda device: time.sleep(0.05))
    events = tmp_path / "events"
    probe.interfere("prep_locked", str(tmp_path / "gpu.lock"), str(events), 1.0)
    children = [json.loads(line) for line in events.read_text().splitlines()]
    assert len(children) >= 1
    for c in children:
        order = [
            c["forked"],
            c["ctx_done"],
            c["kernels_start"],
            c["kernels_done"],
            c["exit_start"],
            c["reaped"],
        ]
        assert order == sorted(order), c
        assert c["ctx_done"] - c["forked"] >= 0.05 and c["kernels_done"] - c["kernels_start"] >= 0.05


def test_timings_are_classified_by_the_first_overlapping_window() -> None:
    child = {
        "forked": 0.0,
        "ctx_done": 1.0,
        "kernels_start": 1.2,
        "kernels_done": 1.4,
        "exit_start": 2.0,
        "reaped": 2.1,
    }
    failed = {**child, "ctx_done": None, "kernels_start": None, "kernels_done": None}

    def timing(start: float, end: float) -> dict[str, float]:
        return {"start": start, "end": end}

    assert probe.classify(timing(0.5, 1.3), [child]) == "ctx"
    assert probe.classify(timing(1.25, 1.3), [child]) == "kernels"
    assert probe.classify(timing(1.9, 2.05), [child]) == "exit"
    assert probe.classify(timing(1.5, 1.9), [child]) == "quiet"
    assert probe.classify(timing(1.25, 1.3), [failed]) == "quiet"


def test_summary_counts_escapes() -> None:
    timings = [{"escaped_us": e, "median_us": m} for e, m in [(0.0, 2.5), (0.5, 2.6), (0.0, 2.5), (0.7, 2.4)]]
    s = probe.summarize(timings)
    assert (s["n"], s["escaped"], s["escaped_share"], s["escaped_us_median"]) == (4, 2, 0.5, 0.6)
    assert probe.summarize([]) == {"n": 0}
