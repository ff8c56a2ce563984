"""GRPO normalisation by prompt group (slime_ext/slime_plugins/reward_post.py), compared with
slime's own `RolloutManager._post_process_rewards` arithmetic (reshape to [-1, n], mean, torch
std + 1e-6) on uniform groups, and hand-computed on the per_turn fan-out."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.slime_double import install

install()

from slime.utils.types import Sample  # noqa: E402

from slime_ext.slime_plugins.reward_post import post_process  # noqa: E402

pytestmark = pytest.mark.unit


def args(**kw) -> SimpleNamespace:
    base = {"advantage_estimator": "grpo", "rewards_normalization": True, "grpo_std_normalization": True}
    return SimpleNamespace(**{"reward_key": None, **base, **kw})


def samples(groups: list[list[float]]) -> list[Sample]:
    out = []
    for g, rewards in enumerate(groups):
        for r in rewards:
            out.append(Sample(group_index=g, index=len(out), reward=r))
    return out


def slime_reference(raw: list[float], n: int, divide: bool) -> list[float]:
    """slime's rule for exactly rollout_batch_size x n samples."""
    rewards = torch.tensor(raw, dtype=torch.float).reshape(-1, n)
    rewards = rewards - rewards.mean(dim=-1, keepdim=True)
    if divide:
        rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
    return rewards.flatten().tolist()


@pytest.mark.parametrize(
    ("estimator", "std_norm", "divide"),
    [
        ("grpo", True, True),
        ("gspo", True, True),
        ("grpo", False, False),
        ("reinforce_plus_plus_baseline", True, False),
    ],
)
def test_uniform_groups_match_slime(estimator, std_norm, divide) -> None:
    groups = [[0.0, 0.1, 0.42, 1.3], [0.3, 0.3, 0.0, 2.1], [0.5, 0.5, 0.5, 0.5]]
    a = args(advantage_estimator=estimator, grpo_std_normalization=std_norm)
    raw, norm = post_process(a, samples(groups))
    assert raw == [r for g in groups for r in g]
    assert norm == pytest.approx(slime_reference(raw, 4, divide), abs=1e-5)


def test_per_turn_fan_out_groups_by_prompt() -> None:
    # prompt 0: trajectory A (turns G=[0.428, 0.82, 1.3]), trajectory B (one turn, G=[0.0]); prompt 1: 2 turns
    flat = samples([[0.428, 0.82, 1.3, 0.0], [0.1, 0.3]])
    raw, norm = post_process(args(), flat)
    g0 = [0.428, 0.82, 1.3, 0.0]
    mean = sum(g0) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in g0) / 3)
    assert norm[:4] == pytest.approx([(x - mean) / (std + 1e-6) for x in g0])
    std1 = math.sqrt(2 * 0.1**2)  # values 0.1, 0.3 around 0.2, Bessel
    assert norm[4:] == pytest.approx([-0.1 / (std1 + 1e-6), 0.1 / (std1 + 1e-6)])
    # slime's default would have treated all 6 samples as one group: different numbers
    whole = slime_reference(raw, 6, True)
    assert norm != pytest.approx(whole, abs=1e-3)


def test_removed_samples_and_singletons() -> None:
    flat = samples([[1.0, 0.0, 0.0], [0.7]])
    flat[2].remove_sample = True  # aborted: placeholder reward, not part of the statistics
    _, norm = post_process(args(grpo_std_normalization=False), flat)
    assert norm == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_no_normalisation_and_reward_key() -> None:
    flat = samples([[1.0, 0.0]])
    assert post_process(args(rewards_normalization=False), flat) == ([1.0, 0.0], [1.0, 0.0])
    assert post_process(args(advantage_estimator="ppo"), flat) == ([1.0, 0.0], [1.0, 0.0])
    for s, v in zip(flat, (2.0, 4.0), strict=True):
        s.reward = {"score": v}
    raw, norm = post_process(args(reward_key="score", grpo_std_normalization=False), flat)
    assert raw == [2.0, 4.0] and norm == pytest.approx([-1.0, 1.0])


def test_missing_group_index_is_an_error() -> None:
    flat = samples([[1.0, 0.0]])
    flat[1].group_index = None
    with pytest.raises(ValueError, match="group_index"):
        post_process(args(), flat)


def trloo_args(**kw) -> SimpleNamespace:
    return args(kernel_rl={"episode": {"reward": {"credit": "trloo"}}}, **kw)


def turn_samples(
    groups: list[list[list[float]]], removed: frozenset[tuple[int, int]] = frozenset()
) -> list[Sample]:
    """groups[g][k] = the returns G_0.. of trajectory k of prompt g, one Sample per turn (fan-out:
    the siblings share index); `removed` = (g, k) of aborted trajectories (one removed sample)."""
    out, index = [], 0
    for g, trajectories in enumerate(groups):
        for k, returns in enumerate(trajectories):
            if (g, k) in removed:
                out.append(Sample(group_index=g, index=index, reward=0.0, remove_sample=True, metadata={}))
            for t, r in enumerate(returns if (g, k) not in removed else []):
                out.append(Sample(group_index=g, index=index, reward=r, metadata={"kernel_rl": {"turn": t}}))
            index += 1
    return out


def test_trloo_is_leave_one_out_per_turn_by_hand() -> None:
    # prompt 0: three trajectories; the second stopped early after turn 0 (no turn 1, 2), the third after turn 1
    groups = [[[1.0, 0.5, 0.3], [0.3], [0.1, 0.9]], [[2.0, 1.0], [0.0, 0.0]]]
    raw, adv = post_process(trloo_args(), turn_samples(groups))
    assert raw == [1.0, 0.5, 0.3, 0.3, 0.1, 0.9, 2.0, 1.0, 0.0, 0.0]
    expected = [
        1.0 - (0.3 + 0.1) / 2,  # turn 0 of prompt 0: the other two trajectories' G_0
        0.5 - 0.9,  # turn 1: only the third trajectory also reached it
        0.0,  # turn 2: no other trajectory got there, no baseline
        0.3 - (1.0 + 0.1) / 2,
        0.1 - (1.0 + 0.3) / 2,
        0.9 - 0.5,
        2.0 - 0.0,  # prompt 1 never mixes with prompt 0
        1.0 - 0.0,
        0.0 - 2.0,
        0.0 - 1.0,
    ]
    assert adv == pytest.approx(expected)


def test_trloo_differs_from_grpo_by_the_self_inclusion() -> None:
    """On one turn, RLOO's advantage is n/(n-1) times GRPO's mean-centred one (no std division)."""
    returns = [[0.3], [0.1], [0.0], [2.3]]
    _, loo = post_process(trloo_args(), turn_samples([returns]))
    _, centred = post_process(args(grpo_std_normalization=False), samples([[r[0] for r in returns]]))
    assert loo == pytest.approx([c * 4 / 3 for c in centred])
    assert sum(loo) == pytest.approx(0.0)


def test_trloo_leaves_removed_trajectories_out() -> None:
    groups = [[[1.0, 0.2], [9.0, 9.0], [0.4, 0.6]]]
    _, adv = post_process(trloo_args(), turn_samples(groups, removed=frozenset({(0, 1)})))
    # samples: traj0 t0, t1; traj1 removed (one sample); traj2 t0, t1
    assert adv == pytest.approx([1.0 - 0.4, 0.2 - 0.6, 0.0, 0.4 - 1.0, 0.6 - 0.2])


def test_trloo_ignores_the_std_flags_and_needs_turns() -> None:
    groups = [[[1.0], [0.0]]]
    for std in (True, False):
        _, adv = post_process(trloo_args(grpo_std_normalization=std), turn_samples(groups))
        assert adv == pytest.approx([1.0, -1.0])
    plain = samples([[1.0, 0.0]])  # no turn metadata: not from our rollout
    with pytest.raises(ValueError, match="turn"):
        post_process(trloo_args(), plain)
    # an estimator that does not normalise gets the raw returns, as with the other credit modes
    raw, out = post_process(trloo_args(advantage_estimator="ppo"), turn_samples(groups))
    assert out == raw == [1.0, 0.0]
