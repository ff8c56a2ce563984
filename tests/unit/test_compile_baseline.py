"""The torch.compile baseline outside the GPU: the request option, the result fields, the reward's
choice of baseline, the episode asking for it, and fast_p against it in the reports. (The compile
and its timing are the judge's, on a GPU: tests/gpu/test_compile_baseline_gpu.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from eval_server.feedback import build_feedback
from eval_server.schema import EvalResult, TimingStats, ValidationError, parse_options
from slime_ext.reports.metrics import group_summary
from slime_ext.reports.results import TurnResult, parse_sample_result
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.rewards import RewardConfig, should_stop, turn_reward
from tests.reports_fixtures import sample

pytestmark = pytest.mark.unit


def test_the_option_is_a_bool() -> None:
    assert parse_options({"baseline_compile": True}).baseline_compile is True
    assert parse_options({}).baseline_compile is False
    with pytest.raises(ValidationError, match="options.baseline_compile"):
        parse_options({"baseline_compile": "yes"})


def _timed(speedup: float, vs_compile: float | None, source: str | None = "measured") -> EvalResult:
    stats = TimingStats(median_ms=1.0, min_ms=1.0, mean_ms=1.0, iqr_ms=0.0, cv=0.0, trials=20)
    return EvalResult(
        status="ok",
        compiled=True,
        correct=True,
        speedup=speedup,
        reference_timing=stats,
        candidate_timing=stats,
        compile_reference_timing=stats if source in ("measured", "cache") else None,
        speedup_vs_compile=vs_compile,
        compile_baseline=source,
    )


def test_the_result_round_trips_and_the_feedback_names_both() -> None:
    result = _timed(2.5, 1.2)
    back = EvalResult.from_json(result.to_json())
    assert back.speedup_vs_compile == 1.2 and back.compile_reference_timing == result.compile_reference_timing
    assert "Against torch.compile: 1.20x" in build_feedback(result)
    failed = _timed(2.5, 2.5, "failed: torch.compile of the reference: boom; the eager reference stands in")
    assert "torch.compile baseline failed: torch.compile of the reference: boom" in build_feedback(failed)


def test_the_reward_pays_for_the_configured_baseline() -> None:
    result = _timed(2.5, 1.2)
    assert turn_reward(result, RewardConfig()) == pytest.approx(0.3 + 1.5)
    assert turn_reward(result, RewardConfig(baseline="compile")) == pytest.approx(0.3 + 0.2)
    assert should_stop(result, RewardConfig()) and not should_stop(result, RewardConfig(baseline="compile"))
    untimed = dataclasses.replace(result, speedup_vs_compile=None)
    assert turn_reward(untimed, RewardConfig(baseline="compile")) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="baseline"):
        RewardConfig(baseline="inductor")


def test_an_episode_rewarding_the_compile_baseline_asks_for_it() -> None:
    assert EpisodeConfig(reward=RewardConfig(baseline="compile")).eval_options.baseline_compile
    assert not EpisodeConfig().eval_options.baseline_compile


def test_turn_results_carry_it_and_old_lines_still_parse() -> None:
    s = sample("p", 0, [("ok", 2.0)])
    turn = dataclasses.replace(s.turns[0], speedup_vs_compile=0.8)
    line = dataclasses.replace(s, turns=(turn,)).to_json()
    assert parse_sample_result(line).turns[0].speedup_vs_compile == 0.8
    old = dict(line, turns=[{k: v for k, v in line["turns"][0].items() if k != "speedup_vs_compile"}])
    assert parse_sample_result(old).turns[0].speedup_vs_compile is None
    assert isinstance(turn, TurnResult)


def test_fast_p_against_compile_hand_computed() -> None:
    def with_vs_compile(s, vs):  # noqa: ANN001, ANN202
        return dataclasses.replace(s, turns=(dataclasses.replace(s.turns[0], speedup_vs_compile=vs),))

    samples = [
        with_vs_compile(sample("a", 0, [("ok", 3.0)]), 1.5),
        with_vs_compile(sample("a", 1, [("ok", 2.0)]), 0.9),
        with_vs_compile(sample("b", 0, [("ok", 1.2)]), 0.6),
        sample("b", 1, [("incorrect", None)]),
    ]
    final = group_summary(samples)["final"]
    assert final["fast_p"]["1"] == pytest.approx((1.0 + 0.5) / 2)
    assert final["fast_p_vs_compile"]["1"] == pytest.approx((0.5 + 0.0) / 2)
    assert final["fast_p_vs_compile"]["0"] == pytest.approx((1.0 + 0.5) / 2)  # the correct rate
    assert final["geomean_speedup_vs_compile"] == pytest.approx((1.5 * 0.9 * 0.6) ** (1 / 3))
    assert group_summary([sample("c", 0, [("ok", 2.0)])])["final"]["fast_p_vs_compile"] is None
