"""Buffer mode through slime's REAL code (tests/real_slime.py: THUDM/slime @ 624b824a and
Megatron-LM from source; skipped without them): the REAL buffer server on loopback holds trajectory
records; slime's own RolloutManager (built in-process, without Ray) calls our rollout function,
validates and flattens its output (`_get_rollout_data`), logs it through our rollout-log hook
(`log_rollout_data`), post-processes rewards through our hook and converts the samples to train
data (`_convert_samples_to_train_data`); slime's DP schedule (`build_dp_schedule`) and advantage
code (`compute_advantages_and_returns`) then give the per-token advantages that training uses.
The arguments come from slime's own parser and validation (`tests.real_slime.slime_args`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from krl_common.service import running_service
from slime_ext.slime_plugins.rollout import reset_state
from slime_ext.slime_plugins.samples import TRAJECTORY_KEY
from tests.real_slime import real_slime, record_logs, rollout_manager, slime_args
from tests.trajectory_dicts import post_trajectories, trajectory_dict

pytestmark = pytest.mark.integration

HOOKS = [
    "--rollout-function-path", "slime_ext.slime_plugins.rollout.generate_rollout",
    "--custom-reward-post-process-path", "slime_ext.slime_plugins.reward_post.post_process",
    "--custom-rollout-log-function-path", "slime_ext.slime_plugins.rollout_log.log_rollout",
]  # fmt: skip
# GRPO flags of configs/run/kbench_multiturn.sh
GRPO = ["--advantage-estimator", "grpo", "--disable-grpo-std-normalization", "--use-kl-loss",
        "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl"]  # fmt: skip
GROUP_SIZE = 4  # buffer records per group


@pytest.fixture(scope="module")
def slime() -> Iterator[None]:
    with real_slime(megatron=True):
        yield


@pytest.fixture(scope="module")
def buffer_url(slime: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("buffer")
    args = ["--db", str(tmp / "b.sqlite"), "--group-size", str(GROUP_SIZE), "--max-wait-s", "30"]
    with running_service("buffer_server", args, tmp, startup_timeout_s=60) as svc:
        yield svc.url
    reset_state()


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return record_logs(monkeypatch)


_versions = itertools.count(1)


def _args(tmp_path: Path, url: str, *, credit: str, batch: int, n: int, gbs: int, hook: bool = True) -> Any:
    recipe = tmp_path / f"recipe-{credit}.yaml"
    plugins = {"buffer_url": url, "start_runner": False, "batch_wait_s": 5, "max_wait_s": 30}
    recipe.write_text(
        yaml.safe_dump({"kernel_rl": {"episode": {"reward": {"credit": credit}}, "plugins": plugins}})
    )
    (tmp_path / "ref").mkdir(exist_ok=True)
    argv = [*HOOKS, *GRPO, "--custom-config-path", str(recipe), "--rollout-batch-size", str(batch),
            "--n-samples-per-prompt", str(n), "--num-rollout", "10"]  # fmt: skip
    if not hook:
        argv[
            argv.index("--custom-reward-post-process-path") : argv.index("--custom-reward-post-process-path")
            + 2
        ] = []
    return slime_args(argv, global_batch_size=gbs, ref_load=str(tmp_path / "ref"))


def _advantages(args: Any, train_data: dict[str, Any]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """slime's train side on one DP rank: the DP schedule, the rank's rollout data as
    `_split_train_data_by_dp` packs it, then compute_advantages_and_returns. The rollout log-probs
    stand in for the actor's recomputed log-probs (GRPO advantages only take their shape)."""
    from megatron.core import mpu
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns
    from slime.observability.rollout_data_utils import tensorize_rollout_data_for_training
    from slime.utils.dp_schedule import build_dp_schedule

    lengths = [len(t) for t in train_data["tokens"]]
    config = {"dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    partitions, _, _, step_sizes = build_dp_schedule(
        args,
        config,
        lengths,
        global_batch_size=args.global_batch_size,
        rollout_indices=train_data["rollout_ids"],
    )
    (part,) = partitions
    keys = ("tokens", "response_lengths", "rewards", "loss_masks", "rollout_log_probs", "rollout_ids")
    rollout_data: dict[str, Any] = {k: [train_data[k][j] for j in part] for k in keys}
    rollout_data["total_lengths"] = [lengths[j] for j in part]
    tensorize_rollout_data_for_training(rollout_data)
    rollout_data["log_probs"] = rollout_data["rollout_log_probs"]
    mpu.set_pipeline_model_parallel_world_size(1)
    mpu.set_pipeline_model_parallel_rank(0)
    try:
        compute_advantages_and_returns(args, rollout_data)
    finally:
        mpu.set_pipeline_model_parallel_world_size(None)
        mpu.set_pipeline_model_parallel_rank(None)
    assert step_sizes == [args.global_batch_size] * len(step_sizes)
    return partitions, rollout_data["advantages"]


def _turn(iid: str, ep: str, k: int, ret: float, version: int) -> dict[str, Any]:
    """Turn k's record of trajectory `ep` (per-turn credit): tied to its siblings by TRAJECTORY_KEY."""
    meta = {"level": 2, TRAJECTORY_KEY: ep}
    return trajectory_dict(f"{ep}-t{k}", iid, ret, version, sample_index=k, metadata=meta)


def test_trajectory_groups_through_slime(buffer_url: str, tmp_path: Path, logged: list) -> None:
    """Two prompts, four trajectories each: slime's conversion with our post-process gives the
    group-normalised rewards (mean-centred, Dr.GRPO: no std division), equal to slime's own
    normalisation on these uniform groups, and every response token gets that advantage."""
    version = next(_versions)
    rewards = {"a": [0.0, 0.1, 0.3, 0.3], "b": [1.3, 0.3, 0.3, 0.3]}
    post_trajectories(
        buffer_url,
        [trajectory_dict(f"{g}{i}", g, r, version) for g, rs in rewards.items() for i, r in enumerate(rs)],
    )
    args = _args(tmp_path, buffer_url, credit="trajectory", batch=2, n=4, gbs=8)
    mgr = rollout_manager(args)

    from slime.observability.rollout_metrics import log_rollout_data

    data, metrics = mgr._get_rollout_data(rollout_id=version)
    assert len(data) == 8 and metrics["rollout/buffer/groups"] == 2.0
    log_rollout_data(version, args, data, metrics, 1.5)
    (logged_metrics,) = logged  # one log call: slime's, carrying our kernel metrics
    assert (
        logged_metrics["rollout/kernel/trajectories"] == 8
        and logged_metrics["rollout/kernel/correct_rate"] == 1.0
    )
    assert logged_metrics["rollout/buffer/groups"] == 2.0 and logged_metrics["rollout/step"] == version
    assert "rollout/response_len/mean" in logged_metrics  # slime's own metrics still logged

    train = mgr._convert_samples_to_train_data(data)
    by_group: dict[str, list[float]] = {}
    for s in data:
        by_group.setdefault(s.label, []).append(s.reward)
    expected = [s.reward - sum(by_group[s.label]) / 4 for s in data]
    assert train["rewards"] == pytest.approx(expected, abs=1e-6)
    assert train["raw_reward"] == [s.reward for s in data]
    assert train["tokens"] == [s.tokens for s in data] and train["loss_masks"] == [[1, 1, 0, 0, 1]] * 8
    assert train["rollout_log_probs"] == [[-0.5, -0.25, 0.0, 0.0, -1.0]] * 8
    assert train["rollout_ids"] == [s.index for s in data] and len(set(train["rollout_ids"])) == 8
    assert train["rollout_mask_sums"] == [3] * 8 and train["truncated"] == [0] * 8

    no_hook = rollout_manager(
        _args(tmp_path, buffer_url, credit="trajectory", batch=2, n=4, gbs=8, hook=False)
    )
    _, slime_rewards = no_hook._post_process_rewards(data)  # slime's own normalisation
    assert slime_rewards == pytest.approx(train["rewards"], abs=1e-6)

    (part,), advantages = _advantages(args, train)
    assert sorted(part) == list(range(8))
    for j, adv in zip(part, advantages, strict=True):
        assert torch.allclose(adv, torch.full((5,), expected[j]), atol=1e-6)


def test_per_turn_fan_out_through_slime(buffer_url: str, tmp_path: Path, logged: list) -> None:
    """Two prompts, two trajectories of two turns each (per_turn credit): slime validates the
    fan-out (siblings share rollout_id), our post-process normalises the four turn returns of each
    prompt together (slime's own rule would pool both prompts: 8 != 2 x 2 samples), slime counts
    one rollout per trajectory in its DP schedule and sums each rollout's mask over its turns."""
    version = next(_versions)

    returns = {
        ("p", "e1"): [0.22, 0.3],
        ("p", "e2"): [0.12, 0.3],
        ("q", "e3"): [0.0, 0.0],
        ("q", "e4"): [1.3, 1.3],
    }
    post_trajectories(
        buffer_url,
        [_turn(iid, ep, k, r, version) for (iid, ep), rs in returns.items() for k, r in enumerate(rs)],
    )
    args = _args(tmp_path, buffer_url, credit="per_turn", batch=2, n=2, gbs=4)
    mgr = rollout_manager(args)
    data, metrics = mgr._get_rollout_data(rollout_id=version)
    assert len(data) == 8 and metrics["rollout/buffer/trajectories"] == 4.0

    from slime.observability.rollout_metrics import log_rollout_data

    log_rollout_data(version, args, data, metrics, 1.0)
    assert logged[0]["rollout/kernel/trajectories"] == 4  # per trajectory, not per turn sample

    train = mgr._convert_samples_to_train_data(data)
    mean = {"p": (0.22 + 0.3 + 0.12 + 0.3) / 4, "q": 1.3 / 2}
    expected = [s.reward - mean[s.label] for s in data]
    assert train["rewards"] == pytest.approx(expected, abs=1e-6)
    _, pooled = rollout_manager(
        _args(tmp_path, buffer_url, credit="per_turn", batch=2, n=2, gbs=4, hook=False)
    )._post_process_rewards(data)
    assert pooled != pytest.approx(expected, abs=1e-3)  # why per_turn needs the hook
    ids = train["rollout_ids"]
    assert len(set(ids)) == 4 and all(ids[i] == ids[i + 1] for i in range(0, 8, 2))  # turns of one trajectory
    assert train["rollout_mask_sums"] == [6] * 8  # 3 masked tokens per turn, both turns

    (part,), advantages = _advantages(args, train)
    assert sorted(part) == list(range(8))  # all four rollouts in the one step of global batch 4
    for j, adv in zip(part, advantages, strict=True):
        assert torch.allclose(adv, torch.full((5,), expected[j]), atol=1e-6)


def test_trloo_through_slime(buffer_url: str, tmp_path: Path, logged: list) -> None:
    """trloo credit (Dr. Kernel's turn-level leave-one-out): the same fan-out as per_turn, and our
    post-process gives each turn the return minus the other trajectory's return at that turn; a
    trajectory that stopped after its first turn leaves the later turns without a baseline (0).
    slime's compute_advantages_and_returns hands exactly that to every response token."""
    version = next(_versions)

    returns = {
        ("u", "r1"): [0.2, 0.5, 0.3],
        ("u", "r2"): [2.3],  # correct and fast at once: early stop
        ("v", "r3"): [0.1, 0.3],
        ("v", "r4"): [0.0, 1.3],
    }
    post_trajectories(
        buffer_url,
        [_turn(iid, ep, k, r, version) for (iid, ep), rs in returns.items() for k, r in enumerate(rs)],
    )
    args = _args(tmp_path, buffer_url, credit="trloo", batch=2, n=2, gbs=4)
    mgr = rollout_manager(args)
    data, _ = mgr._get_rollout_data(rollout_id=version)
    assert len(data) == 8

    train = mgr._convert_samples_to_train_data(data)
    by_turn = {(s.label, s.metadata["kernel_rl"]["turn"], s.index): s.reward for s in data}
    expected = []
    for s in data:
        t = s.metadata["kernel_rl"]["turn"]
        others = [
            r for (label, tt, idx), r in by_turn.items() if label == s.label and tt == t and idx != s.index
        ]
        expected.append(s.reward - sum(others) / len(others) if others else 0.0)
    assert sorted(round(e, 6) for e in expected) == sorted(
        round(e, 6) for e in [0.2 - 2.3, 0.0, 0.0, 2.3 - 0.2, 0.1 - 0.0, 0.3 - 1.3, 0.0 - 0.1, 1.3 - 0.3]
    )
    assert train["rewards"] == pytest.approx(expected, abs=1e-6)
    assert train["raw_reward"] == [s.reward for s in data]

    (part,), advantages = _advantages(args, train)
    assert sorted(part) == list(range(8))
    for j, adv in zip(part, advantages, strict=True):
        assert torch.allclose(adv, torch.full((5,), expected[j]), atol=1e-6)
