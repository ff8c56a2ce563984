"""bench/sync_tail_probe.py's summary on CPU (the timings themselves need a GPU)."""

from __future__ import annotations

import pytest

from bench import sync_tail_probe as probe


def _timing(tail_us: float, escaped: bool = False) -> dict:
    return {"tail_us": tail_us, "launch_us": -80.0, "escaped": escaped, "median_us": 2.4}


def test_summary_per_mode_counts_escapes_per_timing_and_per_process() -> None:
    runs = [
        {"mode": "plain", "timings": [_timing(-48.0), _timing(-46.0)]},
        {"mode": "cupti", "timings": [_timing(-40.0), _timing(5.0, escaped=True)]},
        {"mode": "plain", "timings": [_timing(-30.0), _timing(-28.0)]},
    ]
    rows = probe.summarize(runs)
    assert rows["plain"]["processes"] == 2 and rows["plain"]["timings"] == 4
    assert rows["plain"]["escaped"] == 0 and rows["plain"]["tail_us_max"] == -28.0
    assert rows["plain"]["per_process_tail_us_median"] == [-47.0, -29.0]
    assert (rows["cupti"]["escaped"], rows["cupti"]["processes_escaped"]) == (1, 1)
    assert rows["cupti"]["tail_us_median"] == pytest.approx(-17.5)


def test_a_mode_without_runs_has_no_row() -> None:
    assert probe.summarize([{"mode": "plain", "timings": [_timing(-40.0)]}]).keys() == {"plain"}
