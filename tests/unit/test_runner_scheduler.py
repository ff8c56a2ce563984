"""Group scheduling of the agent runner (buffer_server/runner/scheduler.py): seeded epoch order, skip of
written episodes (with the uids the real store returns), blocked instances; and the store's
runner-support methods."""

from __future__ import annotations

import pytest

from buffer_server.runner.scheduler import (
    EpochQueue,
    episode_uid,
    epoch_order,
    instance_key,
    record_uid,
    validate_run_id,
    written_samples,
)
from buffer_server.store.buffer_store import BufferStore
from buffer_server.store.rules import GroupRules
from slime_ext.rollout.problems import PromptRecord
from slime_ext.trajectory.record import TrajectoryRecord

pytestmark = pytest.mark.unit


def prompts(n: int, level: int = 1) -> list[PromptRecord]:
    return [
        PromptRecord(instance_id=f"p{i}", level=level, problem_id=str(i), name=f"n{i}", reference=f"# {i}\n")
        for i in range(n)
    ]


def drain(queue: EpochQueue) -> list[tuple[int, str, tuple[int, ...]]]:
    out = []
    while (task := queue.next()) is not None:
        out.append((task.epoch, task.instance_id, task.samples))
    assert queue.exhausted
    return out


def test_seeded_order_is_reproducible_and_differs_per_epoch() -> None:
    ps = prompts(20)
    a = [p.instance_id for p in epoch_order(ps, 0, seed=7)]
    assert a == [p.instance_id for p in epoch_order(ps, 0, seed=7)]
    assert sorted(a) == sorted(p.instance_id for p in ps)
    assert a != [p.instance_id for p in epoch_order(ps, 1, seed=7)]
    assert a != [p.instance_id for p in epoch_order(ps, 0, seed=8)]
    assert [p.instance_id for p in epoch_order(ps, 3, seed=None)] == [p.instance_id for p in ps]


def test_epochs_visit_every_prompt_once_per_epoch() -> None:
    tasks = drain(EpochQueue(prompts(5), group_size=3, epochs=3, seed=1))
    assert len(tasks) == 15
    for epoch in range(3):
        ids = [iid for e, iid, _ in tasks if e == epoch]
        assert sorted(ids) == [f"p{i}" for i in range(5)]
    assert [e for e, _, _ in tasks] == sorted(e for e, _, _ in tasks)  # epoch e+1 after all of e
    assert all(samples == (0, 1, 2) for _, _, samples in tasks)
    assert tasks == drain(EpochQueue(prompts(5), group_size=3, epochs=3, seed=1))


def test_written_episodes_are_skipped_and_partial_groups_resume() -> None:
    done = {(0, "p1"): {0, 1}, (0, "p2"): {1}, (1, "p0"): {0, 1}}
    queue = EpochQueue(
        prompts(3), group_size=2, epochs=2, seed=0, done=lambda e, key: done.get((e, key), set())
    )
    tasks = drain(queue)
    assert ("p1" not in [iid for e, iid, _ in tasks if e == 0]) and len(tasks) == 4
    assert (0, "p2", (0,)) in tasks and (0, "p0", (0, 1)) in tasks
    assert [iid for e, iid, _ in tasks if e == 1] == [
        p.instance_id for p in epoch_order(prompts(3), 1, 0) if p.instance_id != "p0"
    ]
    assert queue.skipped_groups == 2 and queue.resumed_groups == 1


def test_blocked_instances_wait_and_never_cross_an_epoch() -> None:
    queue = EpochQueue(prompts(2), group_size=1, epochs=2, seed=None)
    first = queue.next()
    assert first is not None and first.instance_id == "p0"
    # p1 of epoch 0 is blocked: nothing else of epoch 0 is left, and epoch 1 must wait for it
    assert queue.next(blocked={"p1"}) is None
    second = queue.next(blocked={"p0"})
    assert second is not None and (second.epoch, second.instance_id) == (0, "p1")
    third = queue.next(blocked={"p0"})  # epoch 1: p0 is blocked, so p1 comes first
    assert third is not None and (third.epoch, third.instance_id) == (1, "p1")
    assert queue.next(blocked={"p0"}) is None and not queue.exhausted
    assert queue.next().instance_id == "p0" and queue.exhausted


def test_uids_round_trip_through_written_samples() -> None:
    uids = [
        episode_uid("r1", 0, "kb:L1:19", 3),
        record_uid("r1", 2, "a", 1, turn=2),
        record_uid("r1", 2, "a", 1, turn=0),
        episode_uid("other", 0, "a", 0),
        "r1:garbage",
    ]
    assert written_samples("r1", uids) == {(0, "kb:L1:19"): {3}, (2, "a"): {1}}
    long_id = "x" * 250
    uid = episode_uid("r1", 0, long_id, 0)
    assert len(uid) <= 256 and instance_key(long_id).startswith("sha1-")
    assert written_samples("r1", [uid]) == {(0, instance_key(long_id)): {0}}
    with pytest.raises(ValueError, match="run_id"):
        validate_run_id("a:b")


def _record(uid: str, iid: str, reward: float) -> TrajectoryRecord:
    return TrajectoryRecord(
        uid=uid,
        instance_id=iid,
        policy_version=0,
        prompt_token_ids=[1],
        response_token_ids=[2],
        loss_mask=[1],
        rollout_log_probs=[-0.5],
        turn_rewards=[reward],
        turn_eval_results=[None],
        reward=reward,
        status="completed",
    )


def test_store_support_for_resume_backpressure_and_state(tmp_path) -> None:
    with BufferStore(tmp_path / "b.sqlite", GroupRules(group_size=2)) as store:
        store.put(
            [
                _record(episode_uid("r", 0, "p0", 0), "p0", 0.0),
                _record(episode_uid("r", 0, "p0", 1), "p0", 1.0),
            ]
        )
        store.put([_record(episode_uid("r", 0, "p1", 1), "p1", 0.0), _record("rx:e0:s0:p1", "p1", 1.0)])
        assert store.uids_with_prefix("r:") == {"r:e0:s0:p0", "r:e0:s1:p0", "r:e0:s1:p1"}
        ready, partial = store.pending_groups()
        assert sorted(ready) == [("p0", 2), ("p1", 2)] and partial == []
        done = written_samples("r", store.uids_with_prefix("r:"))
        queue = EpochQueue(
            prompts(3), group_size=2, epochs=1, seed=0, done=lambda e, k: done.get((e, k), set())
        )
        assert sorted((t[1], t[2]) for t in drain(queue)) == [("p1", (0,)), ("p2", (0, 1))]
        assert store.get_meta("runner.curriculum") is None
        store.set_meta("runner.curriculum", '{"tier": 1}')
    with BufferStore(tmp_path / "b.sqlite", GroupRules(group_size=2)) as store:
        assert store.get_meta("runner.curriculum") == '{"tier": 1}'
        assert len(store.uids_with_prefix("r")) == 4  # prefix "r" also matches "rx:..."
