"""Rollout metrics and slime's log hooks (slime_ext/slime_plugins/metrics.py, rollout_log.py) on
fixture samples; logging goes to the labelled slime TEST DOUBLE (tests/slime_double)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.slime_double import install

install()

from slime.observability import logging_utils  # noqa: E402

from slime_ext.slime_plugins.metrics import kernel_metrics  # noqa: E402
from slime_ext.slime_plugins.rollout_log import log_eval_rollout, log_rollout  # noqa: E402
from slime_ext.slime_plugins.samples import TRAJECTORY_KEY, group_to_samples  # noqa: E402
from slime_ext.trajectory.record import parse_record  # noqa: E402

pytestmark = pytest.mark.unit


def result(status: str, *, speedup: float | None = None, elapsed: float = 1.0) -> dict:
    compiled = status in ("ok", "incorrect")
    return {"status": status, "compiled": compiled, "correct": status == "ok", "speedup": speedup,
            "elapsed_s": elapsed}  # fmt: skip


def rec(uid: str, level: int, results: list, rewards: list[float], **kw) -> object:
    data = {
        "uid": uid, "instance_id": f"i{level}", "policy_version": 0, "prompt_token_ids": [1, 2],
        "response_token_ids": [3, 4], "loss_mask": [1, 1], "rollout_log_probs": [-0.1, -0.2],
        "turn_rewards": rewards, "turn_eval_results": results, "reward": rewards[0], "status": "completed",
        "metadata": {"level": level},
    }  # fmt: skip
    data.update(kw)
    return parse_record(data)


def trajectory_samples() -> list:
    """4 trajectories: L1 [incorrect, ok 1.5x], L1 [compile_error, no code], L2 [ok (no timing)],
    L2 aborted."""
    recs = [
        rec("a", 1, [result("incorrect", elapsed=1.0), result("ok", speedup=1.5, elapsed=3.0)], [0.1, 0.8]),
        rec("b", 1, [result("compile_error", elapsed=2.0), None], [0.0, 0.0]),
        rec("c", 2, [result("ok", elapsed=4.0)], [0.3]),
        rec("d", 2, [result("ok", speedup=3.0, elapsed=5.0)], [2.3], status="aborted"),
    ]
    samples, _ = group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)
    return samples


def test_metrics_by_level_and_turn() -> None:
    m = kernel_metrics(trajectory_samples())
    k = "rollout/kernel/"
    assert m[k + "trajectories"] == 4 and m[k + "aborted_rate"] == 0.25
    assert m[k + "compile_rate"] == pytest.approx(2 / 3)
    assert m[k + "correct_rate"] == pytest.approx(2 / 3) and m[k + "fast_1_rate"] == pytest.approx(1 / 3)
    assert (
        m[k + "level1/n"] == 2 and m[k + "level1/correct_rate"] == 0.5 and m[k + "level1/fast_1_rate"] == 0.5
    )
    assert (
        m[k + "level2/n"] == 1 and m[k + "level2/correct_rate"] == 1.0 and m[k + "level2/fast_1_rate"] == 0.0
    )
    assert m[k + "turn0/n"] == 3 and m[k + "turn0/compile_rate"] == pytest.approx(2 / 3)
    assert m[k + "turn0/correct_rate"] == pytest.approx(1 / 3)
    assert m[k + "turn1/n"] == 2 and m[k + "turn1/correct_rate"] == 0.5 and m[k + "turn1/fast_1_rate"] == 0.5
    assert m[k + "turn1/mean_reward"] == pytest.approx(0.4)
    assert m[k + "mean_turns"] == pytest.approx(5 / 3)
    assert m[k + "mean_return"] == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    # latency over every evaluated turn (aborted trajectories included: the evaluator did the work)
    assert m[k + "eval_latency_s/mean"] == pytest.approx(3.0) and m[k + "eval_latency_s/max"] == 5.0
    assert m[k + "eval_latency_s/p50"] == 3.0
    assert m[k + "speedup_correct/mean"] == pytest.approx(2.25)


def test_statuses_and_the_checks_that_ended_turns() -> None:
    """Shares over the evaluated turns (aborted trajectories' too: the evaluator did the work),
    and, for each check id, the share of evaluated turns it ended (a warning on an ok turn is not
    counted)."""
    rejected = dict(result("rejected"), checks=[{"id": "static.forbidden_api", "message": "m"}])
    warned = dict(result("ok", speedup=1.1), checks=[{"id": "runtime.escaped_timing", "message": "w"}])
    recs = [
        rec("a", 1, [rejected, warned], [0.0, 0.5]),
        rec("b", 1, [result("compile_error"), None], [0.0, 0.0]),
        rec("c", 1, [result("incorrect")], [0.0]),
    ]
    samples, _ = group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)
    m = kernel_metrics(samples)
    k = "rollout/kernel/"
    assert {key: v for key, v in m.items() if key.startswith(k + "status/")} == {
        k + "status/compile_error": 0.25, k + "status/incorrect": 0.25, k + "status/ok": 0.25,
        k + "status/rejected": 0.25}  # fmt: skip
    assert {key: v for key, v in m.items() if key.startswith(k + "check/")} == {k + "check/static.forbidden_api": 0.25}


def test_own_share_of_correct_profiled_turns() -> None:
    """GPU evaluations carry kernel_time: its own_share is averaged over correct turns only."""

    def profiled(status: str, share: float) -> dict:
        return dict(result(status, speedup=1.2 if status == "ok" else None), kernel_time={"own_share": share})

    recs = [
        rec("a", 1, [profiled("incorrect", 0.1), profiled("ok", 0.9)], [0.1, 0.5]),
        rec("b", 1, [profiled("ok", 0.5)], [0.5]),
        rec("c", 1, [result("ok", speedup=1.1)], [0.4]),  # not profiled (CPU): not counted
    ]
    samples, _ = group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)
    assert kernel_metrics(samples)["rollout/kernel/own_share_correct/mean"] == pytest.approx(0.7)
    assert "rollout/kernel/own_share_correct/mean" not in kernel_metrics(trajectory_samples())


def test_eval_time_by_phase() -> None:
    """The eval server's per-phase seconds are averaged per phase over the turns that ran it."""

    def phased(status: str, phases: dict[str, float]) -> dict:
        return dict(result(status), phases=phases)

    recs = [
        rec("a", 1, [phased("compile_error", {"static": 0.1, "compile": 2.0}),
                     phased("ok", {"static": 0.3, "compile": 1.0, "timing": 3.0})], [0.0, 0.3]),
        rec("b", 1, [result("ok")], [0.3]),  # no phases reported: counted in no phase
    ]  # fmt: skip
    samples, _ = group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)
    m = kernel_metrics(samples)
    k = "rollout/kernel/eval_phase_s/"
    assert m[k + "static/mean"] == pytest.approx(0.2) and m[k + "compile/mean"] == pytest.approx(1.5)
    assert m[k + "timing/mean"] == pytest.approx(3.0)
    assert not any(key.startswith(k) for key in kernel_metrics(trajectory_samples()))


def test_episode_time_split_from_the_records_timing() -> None:
    """The runner's records carry metadata.timing: the metrics average it over trajectories that have it."""
    recs = [
        rec("a", 1, [result("ok")], [0.3], metadata={"level": 1, "timing": {"total_s": 10.0, "generate_s": 4.0,
                                                                          "eval_s": 6.0}}),
        rec("b", 1, [result("ok")], [0.3], metadata={"level": 1, "timing": {"total_s": 6.0, "generate_s": 2.0,
                                                                          "eval_s": 4.0}}),
        rec("c", 1, [result("ok")], [0.3]),  # no timing recorded: not counted
    ]  # fmt: skip
    samples, _ = group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)
    m = kernel_metrics(samples)
    k = "rollout/kernel/"
    assert m[k + "episode_s/mean"] == pytest.approx(8.0)
    assert m[k + "episode_generate_s/mean"] == pytest.approx(3.0) and m[k + "episode_eval_s/mean"] == 5.0
    assert k + "episode_s/mean" not in kernel_metrics(trajectory_samples())


def test_per_turn_siblings_count_once() -> None:
    def turn(uid: str, k: int, res: dict, reward: float) -> object:
        return rec(uid, 1, [res], [reward], sample_index=k, metadata={"level": 1, TRAJECTORY_KEY: "e1"})

    recs = [turn("e1-0", 0, result("incorrect"), 0.22), turn("e1-1", 1, result("ok", speedup=2.0), 0.3)]
    out, _ = group_to_samples(recs, credit="per_turn", group_index=0, first_index=0)
    flat = [s for traj in out for s in traj]
    m = kernel_metrics(flat)
    assert m["rollout/kernel/trajectories"] == 1 and m["rollout/kernel/mean_turns"] == 2
    assert m["rollout/kernel/turn1/fast_1_rate"] == 1.0 and m["rollout/kernel/turn0/correct_rate"] == 0.0
    assert m["rollout/kernel/mean_return"] == pytest.approx(0.22)  # G_0 of the first turn sample


def test_log_rollout_adds_to_slime_metrics_or_logs_itself() -> None:
    args = SimpleNamespace(wandb_always_use_train_step=False)
    samples = trajectory_samples()
    extra = {"rollout/buffer/groups": 1.0}
    logging_utils.LOGGED.clear()
    assert log_rollout(7, args, samples, extra, 12.0) is False  # slime's default logging still runs
    assert extra["rollout/kernel/correct_rate"] == pytest.approx(2 / 3) and not logging_utils.LOGGED
    assert log_rollout(7, args, samples, None, 12.0) is False
    (logged, step_key), = logging_utils.LOGGED  # fmt: skip
    assert step_key == "rollout/step" and logged["rollout/step"] == 7
    assert logged["rollout/kernel/level1/n"] == 2
    logging_utils.LOGGED.clear()
    assert log_eval_rollout(3, args, {"kb": {"rewards": [0.1], "samples": samples}}, None) is False
    (logged, step_key), = logging_utils.LOGGED  # fmt: skip
    assert step_key == "eval/step" and logged["eval/kb/kernel/correct_rate"] == pytest.approx(2 / 3)
    logging_utils.LOGGED.clear()
    assert kernel_metrics([]) == {}
