"""Paired comparison of two runs: bootstrap intervals (deterministic, against the normal
approximation), per-problem values, refusal of mismatched files, the markdown and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from krl_common.validation import ValidationError
from slime_ext.reports.compare import compare_runs, paired_bootstrap, per_problem_values, render_comparison
from tests.reports_fixtures import sample
from tools import compare_runs as compare_tool

pytestmark = pytest.mark.unit


def test_identical_runs_have_a_zero_interval() -> None:
    ci = paired_bootstrap([0.2, 0.5, 1.0], [0.2, 0.5, 1.0], resamples=500)
    assert (ci.diff, ci.low, ci.high, ci.p_b_better, ci.n) == (0.0, 0.0, 0.0, 0.5, 3)


def test_constant_difference() -> None:
    ci = paired_bootstrap([0.0] * 20, [1.0] * 20, resamples=200)
    assert (ci.mean_a, ci.mean_b, ci.diff, ci.low, ci.high, ci.p_b_better) == (0.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def test_interval_matches_the_normal_approximation_and_is_seeded() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 400).astype(float)
    b = np.clip(a + (rng.random(400) < 0.2), 0, 1)  # B fixes ~20 % of A's failures
    ci = paired_bootstrap(a.tolist(), b.tolist(), resamples=4000, seed=7)
    d = b - a
    se = d.std(ddof=0) / math.sqrt(len(d))
    assert ci.diff == pytest.approx(d.mean())
    assert ci.low == pytest.approx(d.mean() - 1.96 * se, abs=0.01)
    assert ci.high == pytest.approx(d.mean() + 1.96 * se, abs=0.01)
    assert ci.p_b_better == 1.0
    assert paired_bootstrap(a.tolist(), b.tolist(), resamples=4000, seed=7) == ci
    assert paired_bootstrap(a.tolist(), b.tolist(), resamples=4000, seed=8) != ci
    wide = paired_bootstrap(a.tolist(), b.tolist(), resamples=4000, seed=7, confidence=0.99)
    assert wide.low < ci.low and wide.high > ci.high


def test_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        paired_bootstrap([], [])
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0], confidence=1.0)


def run_a():
    return [
        sample("p1", 0, [("ok", 2.0)]),
        sample("p1", 1, [("incorrect", None)]),
        sample("p2", 0, [("incorrect", None)]),
        sample("p2", 1, [("incorrect", None)]),
        sample("p3", 0, [("ok", None)], level=2),
        sample("only_a", 0, [("ok", 1.0)]),
    ]


def run_b():
    return [
        sample("p1", 0, [("ok", 3.0)]),
        sample("p1", 1, [("ok", 0.5)]),
        sample("p2", 0, [("incorrect", None), ("ok", 1.2)]),
        sample("p2", 1, [("incorrect", None)]),
        sample("p2", 2, [("ok", 5.0)], status="aborted"),  # left out
        sample("p3", 0, [("ok", None)], level=2),
        sample("only_b", 0, [("ok", 1.0)], level=2),
    ]


def test_per_problem_values() -> None:
    v = per_problem_values(run_b(), ["correct", "fast_1", "mean_speedup"])
    assert v["p1"] == {"correct": 1.0, "fast_1": 0.5, "mean_speedup": pytest.approx(1.75)}
    assert v["p2"] == {"correct": 0.5, "fast_1": 0.5, "mean_speedup": pytest.approx(0.6)}
    assert v["p3"]["mean_speedup"] is None  # untimed correct sample
    assert per_problem_values(run_b(), ["correct"], turn=1)["p2"]["correct"] == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        per_problem_values(run_b(), ["speed"])


def test_compare_runs_table_and_problems() -> None:
    c = compare_runs(run_a(), run_b(), label_a="base", label_b="rl", resamples=300)
    assert c.paired == ["p1", "p2", "p3"] and c.only_a == ["only_a"] and c.only_b == ["only_b"]
    rows = {(r.level, r.metric): r.ci for r in c.rows}
    overall = rows[("all", "correct")]
    assert (overall.mean_a, overall.mean_b, overall.n) == (pytest.approx(0.5), pytest.approx(2.5 / 3), 3)
    assert overall.diff == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert rows[("all", "mean_speedup")].n == 2  # p3 has no timing
    assert rows[("2", "mean_speedup")] is None
    assert rows[("1", "fast_1")].diff == pytest.approx(((0.5 - 0.5) + (0.5 - 0.0)) / 2)
    md = render_comparison(c)
    assert "# rl (B) vs base (A)" in md and "Paired problems: 3 (only in A: 1, only in B: 1)" in md
    assert "| all | correct | 3 | 50.0% | 83.3% | +33.3 pp" in md
    assert "## Problems that differ (2 of 3)" in md and "| p2 | 1 |" in md


def test_refuses_different_problem_sources_and_no_overlap() -> None:
    changed = [sample("p1", 0, [("ok", 1.0)], problem_hash="other")]
    with pytest.raises(ValidationError, match="problem_hash differs"):
        compare_runs(run_a(), changed)
    with pytest.raises(ValidationError, match="no .* problem in common"):
        compare_runs(run_a(), [sample("zz", 0, [("ok", 1.0)])])
    with pytest.raises(ValueError, match="turn must be >= 1"):
        compare_runs(run_a(), run_b(), turn=0)
    first_turn = compare_runs(run_a(), run_b(), turn=1, resamples=100)
    assert {(r.level, r.metric): r.ci for r in first_turn.rows}[("1", "correct")].mean_b == pytest.approx(
        0.5
    )  # final: 0.75


def write(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a" / "results.jsonl", run_a())
    b = write(tmp_path / "b.jsonl", run_b())
    out = tmp_path / "cmp.md"
    args = [str(a.parent), str(b), "--labels", "base,rl", "--fast-p", "1,1.5", "--resamples", "200"]
    assert compare_tool.main([*args, "--out", str(out)]) == 0
    text = out.read_text()
    assert "| all | fast_1.5 | 3 |" in text and "# rl (B) vs base (A)" in text
    assert compare_tool.main(args) == 0 and capsys.readouterr().out == text  # same seed, same result
    train = write(tmp_path / "t.jsonl", [sample("p1", 0, [("ok", 1.0)], split="train")])
    assert compare_tool.main([str(a), str(train)]) == 2  # train: bad input
    assert "train split" in capsys.readouterr().err
    assert compare_tool.main([str(a), str(train), "--allow-train"]) == 0
    assert compare_tool.main([str(a), str(tmp_path / "missing.jsonl")]) == 2  # missing: usage error
