"""The evaluation report of a results file: a JSON summary, a markdown table, PNG plots.

Every output is written to a temporary name and renamed when complete, so a report on disk is
always whole; the report is rebuilt from the results file alone (`build_summary`), so an
interrupted or resumed run reports exactly what its file holds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from krl_common.fileio import atomic_write
from slime_ext.reports.metrics import FAST_P_THRESHOLDS, NO_RESPONSE, per_problem, summarize
from slime_ext.reports.results import TURN_STATUSES, SampleResult, latest_results

__all__ = [
    "REPORT_FILES",
    "build_summary",
    "fmt_rate",
    "markdown_table",
    "render_markdown",
    "write_report",
]

REPORT_FILES = {
    "summary": "summary.json",
    "markdown": "report.md",
    "fast_p_plot": "fast_p.png",
    "turns_plot": "turns.png",
}


def build_summary(
    records: Sequence[SampleResult],
    run: Mapping[str, Any],
    *,
    thresholds: Sequence[float] = FAST_P_THRESHOLDS,
    ks: Sequence[int] | None = None,
    max_turns: int | None = None,
) -> dict[str, Any]:
    """The JSON summary: the run's settings, the metrics of the latest record per sample (per
    level, per turn) and one row per problem."""
    samples = latest_results(records)
    return {
        "run": dict(run),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "thresholds": list(thresholds),
        "metrics": summarize(samples, thresholds=thresholds, ks=ks, max_turns=max_turns),
        "problems": per_problem(samples),
    }


# ---------------------------------------------------------------------------- markdown


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _fmt_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _level_label(key: str) -> str:
    return "all" if key == "all" else f"L{key}"


def _status_columns(metrics: Mapping[str, Any]) -> list[str]:
    seen: set[str] = set()
    for group in metrics.values():
        if "final" in group:
            seen.update(group["final"]["status"])
            for t in group["attempt_status_per_turn"]:
                seen.update(t)
    order = [*TURN_STATUSES, NO_RESPONSE]
    return [s for s in order if s in seen] + sorted(seen - set(order))


def render_markdown(summary: Mapping[str, Any]) -> str:
    """Tables: final metrics per level, metrics per turn, status breakdowns, per problem."""
    run = summary["run"]
    metrics = summary["metrics"]
    thresholds = summary["thresholds"]
    p_keys = [f"{p:g}" for p in thresholds]
    groups = [(k, g) for k, g in metrics.items() if "final" in g]
    out = [f"# Evaluation: {run.get('model', '?')}", ""]
    settings = ", ".join(
        f"{k} {run[k]}"
        for k in (
            "kernel_backend",
            "backend",
            "samples_per_problem",
            "max_turns",
            "temperature",
            "split",
            "config_id",
        )
        if k in run
    )
    out += [f"Settings: {settings}. Generated {summary['generated_at']}.", ""]

    all_group = metrics.get("all", {})
    untimed = all_group.get("final", {}).get("untimed_correct", 0)
    if all_group.get("aborted"):
        out += [
            f"{all_group['aborted']} aborted sample(s) (not the model's outcome) are left out; re-run to redo them.",
            "",
        ]
    if untimed:
        out += [
            f"{untimed} correct sample(s) have no timing (CPU evaluation): fast_p for p > 0 counts them as not fast.",
            "",
        ]

    pass_ks = sorted({k for _, g in groups for k in g["pass_at_k"]}, key=int)
    out += ["## Final (best of all turns)", ""]
    header = ["level", "problems", "samples", *(f"fast_{p}" for p in p_keys), "geomean speedup"]
    header += [f"pass@{k}" for k in pass_ks]
    rows = []
    for key, g in groups:
        f = g["final"]
        row = [_level_label(key), g["problems"], g["samples"]]
        row += [fmt_rate(f["fast_p"][p]) for p in p_keys]
        row += [_fmt_speedup(f["geomean_speedup"])]
        row += [fmt_rate(g["pass_at_k"].get(k)) for k in pass_ks]
        rows.append(row)
    out += [markdown_table(header, rows), "", "fast_0 is the correct rate.", ""]

    compiled = [(key, g) for key, g in groups if g["final"].get("fast_p_vs_compile")]
    if compiled:
        out += ["## Final against torch.compile (the reference compiled, default mode)", ""]
        header = ["level", *(f"fast_{p}" for p in p_keys), "geomean speedup"]
        rows = [
            [_level_label(key)]
            + [fmt_rate(g["final"]["fast_p_vs_compile"][p]) for p in p_keys]
            + [_fmt_speedup(g["final"]["geomean_speedup_vs_compile"])]
            for key, g in compiled
        ]
        out += [markdown_table(header, rows), ""]

    out += ["## Per turn (best of the first t turns)", ""]
    header = ["level", "turn", *(f"fast_{p}" for p in p_keys), "geomean speedup"]
    rows = []
    for key, g in groups:
        for t in g["per_turn"]:
            rows.append(
                [_level_label(key), t["turn"], *(fmt_rate(t["fast_p"][p]) for p in p_keys)]
                + [_fmt_speedup(t["geomean_speedup"])]
            )
    out += [markdown_table(header, rows), ""]

    columns = _status_columns(metrics)
    out += ["## Outcome status (best of all turns, samples)", ""]
    rows = [[_level_label(k), *(g["final"]["status"].get(c, 0) for c in columns)] for k, g in groups]
    out += [markdown_table(["level", *columns], rows), ""]

    out += ["## Attempt status per turn (every attempt made at that turn)", ""]
    rows = []
    for key, g in groups:
        for i, counts in enumerate(g["attempt_status_per_turn"]):
            rows.append(
                [_level_label(key), i + 1, sum(counts.values()), *(counts.get(c, 0) for c in columns)]
            )
    out += [markdown_table(["level", "turn", "attempts", *columns], rows), ""]

    rows = [
        [_level_label(key), role, r["attempts"], fmt_rate(r["correct_rate"]), fmt_rate(r["fast_1"]),
         _fmt_speedup(r["geomean_speedup"])]
        for key, g in groups
        for role, r in g.get("per_role", {}).items()
    ]  # fmt: skip
    if rows:
        out += ["## Per role (every attempt made in that role)", ""]
        out += [
            markdown_table(["level", "role", "attempts", "correct", "fast_1", "geomean speedup"], rows),
            "",
        ]

    out += ["## Per problem (best of all turns)", ""]
    rows = [
        [
            p["instance_id"],
            f"L{p['level']}",
            p["samples"],
            fmt_rate(p["correct_rate"]),
            fmt_rate(p["fast_1"]),
            _fmt_speedup(p["best_speedup"]),
            ", ".join(f"{k} {v}" for k, v in p["status"].items()),
        ]
        for p in summary.get("problems", [])
    ]
    header = ["problem", "level", "samples", "correct", "fast_1", "best speedup", "outcomes"]
    out += [markdown_table(header, rows), ""]
    return "\n".join(out)


def write_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[SampleResult],
    run: Mapping[str, Any],
    *,
    thresholds: Sequence[float] = FAST_P_THRESHOLDS,
    ks: Sequence[int] | None = None,
    max_turns: int | None = None,
    plots: bool = True,
) -> dict[str, Path]:
    """Write summary.json, report.md and (with `plots`) fast_p.png and turns.png; their paths."""
    out = Path(out_dir)
    summary = build_summary(records, run, thresholds=thresholds, ks=ks, max_turns=max_turns)
    written = {"summary": out / REPORT_FILES["summary"], "markdown": out / REPORT_FILES["markdown"]}
    atomic_write(written["summary"], json.dumps(summary, indent=1) + "\n")
    atomic_write(written["markdown"], render_markdown(summary))
    if plots:
        from slime_ext.reports.plots import plot_fast_p, plot_turns

        written["fast_p_plot"] = out / REPORT_FILES["fast_p_plot"]
        written["turns_plot"] = out / REPORT_FILES["turns_plot"]
        atomic_write(written["fast_p_plot"], plot_fast_p(summary))
        atomic_write(written["turns_plot"], plot_turns(summary))
    return written
