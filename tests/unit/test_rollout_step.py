"""tools/rollout_step.py: the per-turn summary of consumed trajectories and its table."""

from __future__ import annotations

import pytest

from slime_ext.trajectory.record import TrajectoryRecord
from tools.rollout_step import format_summary, summarize

pytestmark = pytest.mark.unit


def _rec(
    uid: str, rewards: list[float], results: list[dict | None], status: str = "completed"
) -> TrajectoryRecord:
    return TrajectoryRecord(
        uid=uid,
        instance_id="p",
        policy_version=0,
        prompt_token_ids=[1],
        response_token_ids=[2],
        loss_mask=[1],
        rollout_log_probs=[-0.5],
        turn_rewards=rewards,
        turn_eval_results=results,
        reward=rewards[-1],
        status=status,
    )


def test_summary_counts_per_turn() -> None:
    records = [
        _rec("a", [0.0, 0.3], [None, {"compiled": True, "correct": True}]),
        _rec("b", [0.1, 0.0], [{"compiled": True, "correct": False}, {"compiled": False, "correct": False}]),
        _rec("c", [0.0], [None], status="truncated"),
    ]
    s = summarize(records)
    assert s["records"] == 3 and s["statuses"] == {"completed": 2, "truncated": 1}
    t1, t2 = s["turns"]
    assert (t1["turn"], t2["turn"]) == (1, 2)  # 1-based in the JSON, as in the table
    assert (t1["episodes"], t1["evaluated"], t1["compiled"], t1["correct"]) == (3, 1, 1, 0)
    assert t1["mean_reward"] == pytest.approx(0.1 / 3)
    assert (t2["episodes"], t2["evaluated"], t2["compiled"], t2["correct"]) == (2, 2, 1, 1)
    assert t2["mean_reward"] == pytest.approx(0.15)
    assert s["mean_reward"] == pytest.approx(0.1)
    table = format_summary(s).splitlines()
    assert table[0].split() == [
        "turn",
        "episodes",
        "code",
        "evaluated",
        "compiled",
        "correct",
        "mean",
        "reward",
    ]
    assert table[2].split() == ["1", "3", "1", "1", "0", "0.033"]
    assert [line.split()[0] for line in table[2:4]] == [str(t1["turn"]), str(t2["turn"])]
    assert table[-1] == "3 trajectories (completed 2, truncated 1); mean final reward 0.100"


def test_empty_summary() -> None:
    s = summarize([])
    assert s == {"records": 0, "statuses": {}, "mean_reward": 0.0, "turns": []}
