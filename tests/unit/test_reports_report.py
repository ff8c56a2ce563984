"""The report: JSON summary, markdown tables, PNG plots, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from krl_common.fileio import atomic_write
from slime_ext.reports.plots import plot_fast_p, plot_turns
from slime_ext.reports.report import build_summary, render_markdown, write_report
from tests.reports_fixtures import sample

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n"
RUN = {"model": "qwen-test", "backend": "chat", "max_turns": 2, "samples_per_problem": 2, "config_id": "abc"}


def records():
    return [
        sample("a", 0, [("incorrect", None), ("ok", 2.0)]),
        sample("a", 1, [("ok", 0.5)]),
        sample("b", 0, [("no_code", None), ("compile_error", None)], level=2),
        sample("b", 1, [("ok", None)], level=2),
        sample("b", 1, [("timeout", None)], level=2, status="aborted"),  # the newer line: aborted
    ]


def test_summary_uses_the_latest_record_per_sample() -> None:
    s = build_summary(records(), RUN, max_turns=2)
    assert s["run"] == RUN and s["thresholds"] == [0.0, 0.5, 0.8, 1.0, 1.5, 2.0]
    level2 = s["metrics"]["2"]
    assert level2["aborted"] == 1 and level2["samples"] == 1  # b/1's newer line is the aborted one
    assert s["metrics"]["1"]["final"]["correct_rate"] == 1.0
    json.dumps(s)  # plain JSON


def test_markdown_tables() -> None:
    md = render_markdown(build_summary(records(), RUN, max_turns=2))
    assert md.startswith("# Evaluation: qwen-test")
    assert "1 aborted sample(s)" in md
    header = "| level | problems | samples | fast_0 | fast_0.5 | fast_0.8 | fast_1 | fast_1.5 | fast_2 |"
    assert header + " geomean speedup | pass@1 | pass@2 |" in md
    assert "| L1 | 1 | 2 | 100.0% | 50.0% | 50.0% | 50.0% | 50.0% | 0.0% | 1.00x | 100.0% | 100.0% |" in md
    assert "| L2 | 1 | 1 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | - | 0.0% | - |" in md
    assert "| L1 | 1 | 50.0% | 0.0% |" in md  # turn 1 of level 1: a/0 incorrect, a/1 ok 0.5
    assert "| level | ok | compile_error | incorrect | no_code |" in md  # statuses in their defined order
    assert "| L2 | 0 | 1 | 0 | 0 |" in md  # outcome of b/0: compile_error (its latest turn)
    assert "| L1 | 1 | 2 | 1 | 0 | 1 | 0 |" in md  # attempts at turn 1 of level 1
    assert "| problem | level | samples | correct | fast_1 | best speedup | outcomes |" in md
    assert "| a | L1 | 2 | 100.0% | 50.0% | 2.00x | ok 2 |" in md
    assert "| b | L2 | 1 | 0.0% | 0.0% | - | compile_error 1 |" in md


def test_write_report_files(tmp_path: Path) -> None:
    written = write_report(tmp_path / "out", records(), RUN, max_turns=2)
    assert set(written) == {"summary", "markdown", "fast_p_plot", "turns_plot"}
    for key in ("fast_p_plot", "turns_plot"):
        assert written[key].read_bytes().startswith(PNG) and written[key].stat().st_size > 5000
    assert json.loads(written["summary"].read_text())["run"]["model"] == "qwen-test"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "fast_p.png",
        "report.md",
        "summary.json",
        "turns.png",
    ]
    no_plots = write_report(tmp_path / "np", records(), RUN, plots=False)
    assert set(no_plots) == {"summary", "markdown"}


def test_plots_return_png_bytes() -> None:
    s = build_summary(records(), RUN)
    assert plot_fast_p(s).startswith(PNG) and plot_turns(s).startswith(PNG)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write(target, "old")
    with pytest.raises(TypeError):
        atomic_write(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]
