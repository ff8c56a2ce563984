"""Metrics against hand-computed values: unbiased pass@k, fast_p, geomean, best-of-first-t
outcomes, per-level / per-turn summaries and status breakdowns."""

from __future__ import annotations

import math

import pytest

from slime_ext.reports.metrics import (
    fast_p,
    geomean,
    group_summary,
    outcome_at_turn,
    pass_at_k,
    per_problem,
    summarize,
)
from tests.reports_fixtures import sample

pytestmark = pytest.mark.unit


def codex_pass_at_k(n: int, c: int, k: int) -> float:
    """The Codex paper's definition, 1 - C(n-c, k) / C(n, k), with exact binomials."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_hand_values() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2)=3, C(5,2)=10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(3, 2, 2) == 1.0  # n - c < k: every k-subset has a correct sample
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 16, 40])
def test_pass_at_k_matches_the_binomial_formula(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(codex_pass_at_k(n, c, k), abs=1e-12)


@pytest.mark.parametrize("args", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_arguments(args) -> None:
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(*args)


def test_geomean() -> None:
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


def test_outcome_is_the_best_of_the_first_t_turns() -> None:
    s = sample("p", 0, [("incorrect", None), ("ok", 1.5), ("ok", 1.2)])
    assert outcome_at_turn(s, 1).status == "incorrect" and not outcome_at_turn(s, 1).correct
    assert outcome_at_turn(s, 2).speedup == 1.5
    assert outcome_at_turn(s, 3).speedup == 1.5  # the best, not the last
    assert outcome_at_turn(s).speedup == 1.5
    assert outcome_at_turn(s, 10).speedup == 1.5  # an episode that ended keeps its outcome
    # a timed correct turn beats an untimed one; without a correct turn, the latest turn counts
    assert outcome_at_turn(sample("p", 0, [("ok", None), ("ok", 0.8)])).speedup == 0.8
    fail = outcome_at_turn(sample("p", 0, [("compile_error", None), ("rejected", None)]))
    assert fail.status == "rejected" and not fail.correct and fail.speedup is None
    assert outcome_at_turn(sample("p", 0, [])).status == "no_response"


def test_fast_p_hand_values() -> None:
    outs = [
        outcome_at_turn(sample("p", i, [t]))
        for i, t in enumerate([("ok", 0.6), ("ok", 1.2), ("ok", None), ("incorrect", None)])
    ]
    assert fast_p(outs, 0.0) == 0.75  # correct rate, timing not needed
    assert fast_p(outs, 0.5) == 0.5
    assert fast_p(outs, 1.0) == 0.25
    assert fast_p(outs, 1.2) == 0.0  # strictly greater
    with pytest.raises(ValueError):
        fast_p([], 1.0)


def fixture_run():
    return [
        # problem a (level 1): 2 samples
        sample("a", 0, [("incorrect", None), ("ok", 2.0)]),
        sample("a", 1, [("ok", 0.5)]),
        # problem b (level 1): 2 samples + 1 aborted (left out)
        sample("b", 0, [("no_code", None), ("compile_error", None)]),
        sample("b", 1, [("ok", 1.6), ("ok", 1.0)]),
        sample("b", 2, [("ok", 9.0)], status="aborted"),
        # problem c (level 2): 2 samples, one untimed correct
        sample("c", 0, [("ok", None)], level=2),
        sample("c", 1, [("timeout", None), ("runtime_error", None)], level=2),
    ]


def test_group_summary_hand_computed() -> None:
    g = group_summary([s for s in fixture_run() if s.level == 1])
    assert (g["problems"], g["samples"], g["aborted"]) == (2, 4, 1)
    f = g["final"]
    # a: both correct (2.0, 0.5); b: one correct (1.6) -> per problem 1.0 and 0.5
    assert f["correct_rate"] == pytest.approx(0.75)
    assert f["fast_p"]["0"] == pytest.approx(0.75)
    assert f["fast_p"]["0.5"] == pytest.approx((0.5 + 0.5) / 2)  # a: 2.0 only (0.5 is not > 0.5)
    assert f["fast_p"]["1"] == pytest.approx((0.5 + 0.5) / 2)
    assert f["fast_p"]["1.5"] == pytest.approx((0.5 + 0.5) / 2)
    assert f["fast_p"]["2"] == 0.0
    assert f["geomean_speedup"] == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))
    assert f["status"] == {"ok": 3, "compile_error": 1}
    # turn 1: a -> [incorrect, ok 0.5], b -> [no_code, ok 1.6]
    t1, t2 = g["per_turn"]
    assert t1["turn"] == 1 and t1["correct_rate"] == pytest.approx(0.5)
    assert t1["fast_p"]["1"] == pytest.approx((0 + 0.5) / 2)
    assert t1["geomean_speedup"] == pytest.approx((0.5 * 1.6) ** 0.5)
    assert t1["status"] == {"incorrect": 1, "ok": 2, "no_code": 1}
    assert t2["correct_rate"] == pytest.approx(0.75)
    # attempts: turn 1 has four, turn 2 three (a/1 stopped after one turn)
    assert g["attempt_status_per_turn"] == [
        {"incorrect": 1, "no_code": 1, "ok": 2},
        {"compile_error": 1, "ok": 2},
    ]
    # pass@k per problem: a n=2 c=2, b n=2 c=1
    assert g["pass_at_k"] == {"1": pytest.approx(0.75), "2": pytest.approx(1.0)}


def test_untimed_correct_and_levels() -> None:
    out = summarize(fixture_run(), ks=[1, 2, 3])
    assert set(out) == {"1", "2", "all"}
    c = out["2"]["final"]
    assert c["correct_rate"] == 0.5 and c["fast_p"]["1"] == 0.0
    assert c["untimed_correct"] == 1 and c["timed_correct"] == 0 and c["geomean_speedup"] is None
    assert c["status"] == {"ok": 1, "runtime_error": 1}
    assert set(out["2"]["pass_at_k"]) == {"1", "2"}  # k=3 > samples per problem: not reported
    assert out["all"]["problems"] == 3 and out["all"]["aborted"] == 1
    assert out["all"]["final"]["correct_rate"] == pytest.approx((1.0 + 0.5 + 0.5) / 3)


def test_max_turns_sets_the_turn_columns_and_empty_groups() -> None:
    g = group_summary(fixture_run()[:2], max_turns=3)
    assert [t["turn"] for t in g["per_turn"]] == [1, 2, 3]
    assert g["per_turn"][2]["correct_rate"] == g["final"]["correct_rate"]
    empty = group_summary([sample("x", 0, [("ok", 1.0)], status="aborted")])
    assert empty["problems"] == 0 and "final" not in empty


def test_per_problem_rows() -> None:
    rows = {r["instance_id"]: r for r in per_problem(fixture_run())}
    assert rows["a"] == {
        "instance_id": "a",
        "problem_id": "a",
        "level": 1,
        "samples": 2,
        "correct_rate": 1.0,
        "fast_1": 0.5,
        "best_speedup": 2.0,
        "status": {"ok": 2},
    }
    assert rows["b"]["samples"] == 2 and rows["b"]["status"] == {"compile_error": 1, "ok": 1}
    assert rows["c"]["best_speedup"] is None and rows["c"]["correct_rate"] == 0.5
