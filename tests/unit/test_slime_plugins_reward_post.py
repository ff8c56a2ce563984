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
