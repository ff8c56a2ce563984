"""slime_ext.rollout.rewards: turn rewards, early stop, returns in both credit modes (hand-computed)."""

from __future__ import annotations

import pytest

from eval_server.schema import Check, EvalResult
from slime_ext.rollout.rewards import (
    RewardConfig,
    discounted_returns,
    episode_returns,
    should_stop,
    trajectory_return,
    turn_reward,
)

pytestmark = pytest.mark.unit


def ok(speedup: float | None = None, checks: list[Check] | None = None) -> EvalResult:
    return EvalResult(status="ok", compiled=True, correct=True, speedup=speedup, checks=checks or [])


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (None, 0.0),
        (EvalResult(status="compile_error"), 0.0),
        (EvalResult(status="timeout", compiled=True), 0.0),
        (EvalResult(status="crashed", compiled=True), 0.0),
        (EvalResult(status="rejected", compiled=True, checks=[Check("static.try_except", "m")]), 0.0),
        (EvalResult(status="incorrect", compiled=True), 0.1),
        (EvalResult(status="runtime_error", compiled=True), 0.1),
        (EvalResult(status="runtime_error", compiled=False), 0.0),
        (ok(), 0.3),
        (ok(0.5), 0.3),
        (ok(1.5), 0.8),
        (ok(2.0), 1.3),
        (ok(3.0), 2.3),
        (ok(10.0), 2.3),
    ],
)
def test_turn_reward_table(result: EvalResult | None, expected: float) -> None:
    assert turn_reward(result) == pytest.approx(expected)


def test_reject_check_on_incorrect_scores_zero() -> None:
    r = EvalResult(status="incorrect", compiled=True, checks=[Check("runtime.low_precision", "m", "reject")])
    assert turn_reward(r) == 0.0
    warn = EvalResult(status="incorrect", compiled=True, checks=[Check("x", "m", "warn")])
    assert turn_reward(warn) == pytest.approx(0.1)


def test_excessive_speedup_cap() -> None:
    res = ok(12.0, [Check("runtime.excessive_speedup", "re-timed", "warn")])
    assert turn_reward(res) == pytest.approx(2.3)  # default cap equals the general cap
    assert turn_reward(res, RewardConfig(excessive_speedup_bonus_cap=0.5)) == pytest.approx(0.8)
    assert turn_reward(ok(1.4), RewardConfig(excessive_speedup_bonus_cap=0.0)) == pytest.approx(0.7)


def test_early_stop() -> None:
    assert should_stop(ok(2.0))
    assert not should_stop(ok(1.9))
    assert not should_stop(ok(None))  # CPU: no timing
    assert should_stop(ok(None), RewardConfig(early_stop_min_speedup=None))
    assert not should_stop(ok(3.0), RewardConfig(early_stop_on_correct=False))
    assert not should_stop(EvalResult(status="incorrect", compiled=True, speedup=5.0))
    assert not should_stop(None)


def test_returns_hand_computed() -> None:
    rewards = [0.1, 0.3, 1.3]
    # G_2 = 1.3; G_1 = 0.3 + 0.4 * 1.3 = 0.82; G_0 = 0.1 + 0.4 * 0.82 = 0.428
    assert discounted_returns(rewards, 0.4) == pytest.approx([0.428, 0.82, 1.3])
    assert trajectory_return(rewards, 0.4) == pytest.approx(0.1 + 0.4 * 0.3 + 0.16 * 1.3)
    assert episode_returns(rewards) == pytest.approx([0.428])
    assert episode_returns(rewards, RewardConfig(credit="per_turn")) == pytest.approx([0.428, 0.82, 1.3])
    assert episode_returns([], RewardConfig(credit="per_turn")) == []
    assert trajectory_return([], 0.4) == 0.0
    assert discounted_returns([1.0, 1.0], 1.0) == [2.0, 1.0]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        RewardConfig(credit="bogus")
    with pytest.raises(ValueError):
        RewardConfig(gamma=1.5)


def test_profile_scale_and_lazy_turns() -> None:
    """Dr. Kernel's PR and PRS: the speedup bonus scaled by the share of GPU time in the
    candidate's own kernels, and a correct turn below `prs_min_share` marked lazy; neither acts
    without a profile or the setting."""
    from eval_server.schema import KernelTime
    from slime_ext.rollout.rewards import is_lazy

    kt = KernelTime(own_share=0.5, own_us=5.0, total_us=10.0)
    fast = EvalResult(status="ok", compiled=True, correct=True, speedup=2.0, kernel_time=kt)
    assert turn_reward(fast, RewardConfig()) == pytest.approx(0.3 + 1.0)
    assert turn_reward(fast, RewardConfig(profile_scale=True)) == pytest.approx(0.3 + 0.5)
    unprofiled = EvalResult(status="ok", compiled=True, correct=True, speedup=2.0)
    assert turn_reward(unprofiled, RewardConfig(profile_scale=True)) == pytest.approx(1.3)
    prs = RewardConfig(prs_min_share=0.6)
    assert is_lazy(fast, prs) and not is_lazy(fast, RewardConfig(prs_min_share=0.5))
    assert not is_lazy(fast, RewardConfig()) and not is_lazy(unprofiled, prs) and not is_lazy(None, prs)
    wrong = EvalResult(status="incorrect", compiled=True, correct=False, kernel_time=kt)
    assert not is_lazy(wrong, prs)  # only correct kernels are lazy
    with pytest.raises(ValueError, match="prs_min_share"):
        RewardConfig(prs_min_share=0.0)
