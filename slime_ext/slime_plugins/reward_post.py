"""GRPO reward normalisation by prompt group, for fan-out (per_turn credit) and uneven groups.

    --custom-reward-post-process-path slime_ext.slime_plugins.reward_post.post_process

slime's own normalisation (`RolloutManager._post_process_rewards`) reshapes the flat rewards to
`[-1, n_samples_per_prompt]` only when there are exactly `rollout_batch_size x n` of them;
otherwise it treats the WHOLE batch as one group. With per_turn credit every turn is a sample, and
a buffer group may be smaller than n (timed-out groups), so that rule would compare rewards across
different prompts. This hook groups by `Sample.group_index` instead (all turn-samples of all
trajectories of one prompt form one group) and otherwise applies slime's arithmetic:

- raw reward: `sample.get_reward_value(args)`;
- only for `--advantage-estimator` grpo / gspo / cispo / reinforce_plus_plus_baseline, and unless
  `--disable-rewards-normalization`: subtract the group mean; for grpo / gspo / cispo also divide by
  (std + 1e-6), std with Bessel's correction as torch's `std()`, unless
  `--disable-grpo-std-normalization` (Dr.GRPO);
- a group of one sample gets 0.0 (slime's std would be NaN there).

One deliberate difference: samples marked `remove_sample` (aborted episodes) are left out of their
group's mean and std and get 0.0; slime would count their placeholder reward 0 in the statistics.
On uniform groups without removed samples the result equals slime's (tested).

With `trloo` credit (the run recipe's `episode.reward.credit`) the same estimators get turn-level
REINFORCE leave-one-out advantages instead (Dr. Kernel, arXiv 2602.05885): a turn sample's
reward G_t minus the mean G_t of the *other* trajectories of its prompt that reached turn t. The
group mean of GRPO includes the sample itself, which shrinks every advantage by (n-1)/n and
couples it to its own return; leave-one-out does not, and comparing at the same turn keeps an
episode that stopped early (early stop, max turns) out of the later turns' baselines. A turn
that no other trajectory of the prompt reached has no baseline and gets 0.0, as a group of one
does above; no std division (RLOO's estimator is unscaled, so the std flags do not apply).
The trajectory of a sample is its `index` (fan-out siblings share it), its turn
`metadata["kernel_rl"]["turn"]` (slime_plugins/samples.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from slime_ext.slime_plugins.config import episode_config
from slime_ext.slime_plugins.samples import METADATA_KEY

__all__ = [
    "HOOK_PATH",
    "leave_one_out_by_turn",
    "NORMALISED_ESTIMATORS",
    "STD_ESTIMATORS",
    "needs_group_hook",
    "normalise_groups",
    "post_process",
]

HOOK_PATH = "slime_ext.slime_plugins.reward_post.post_process"
NORMALISED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_ESTIMATORS = ("grpo", "gspo", "cispo")
EPS = 1e-6


def needs_group_hook(args: Any) -> bool:
    """True when slime will normalise rewards and this hook is not its post-process: then only
    groups of exactly --n-samples-per-prompt samples, without fan-out, are normalised correctly."""
    active = getattr(args, "advantage_estimator", "grpo") in NORMALISED_ESTIMATORS and getattr(
        args, "rewards_normalization", True
    )
    return active and getattr(args, "custom_reward_post_process_path", None) != HOOK_PATH


def normalise_groups(
    rewards: Sequence[float], groups: Sequence[Any], keep: Sequence[bool], *, divide_by_std: bool
) -> list[float]:
    """Group-normalised rewards: (r - mean_g) [/ (std_g + 1e-6)] over the kept samples of group g."""
    members: dict[Any, list[int]] = {}
    for i, (g, k) in enumerate(zip(groups, keep, strict=True)):
        if k:
            members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        values = [float(rewards[i]) for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, v in zip(idx, values, strict=True):
            out[i] = (v - mean) / (std + EPS) if divide_by_std else v - mean
    return out


def leave_one_out_by_turn(
    rewards: Sequence[float], groups: Sequence[Any], turns: Sequence[int], keep: Sequence[bool]
) -> list[float]:
    """TRLOO advantages: r_i - mean(r_j : j != i kept, same group, same turn); 0.0 where no other
    sample of the group has that turn, and for samples not kept."""
    members: dict[tuple[Any, int], list[int]] = {}
    for i, (g, t, k) in enumerate(zip(groups, turns, keep, strict=True)):
        if k:
            members.setdefault((g, t), []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        total = sum(float(rewards[i]) for i in idx)
        for i in idx:
            out[i] = float(rewards[i]) - (total - float(rewards[i])) / (len(idx) - 1)
    return out


def _turn(sample: Any) -> int:
    summary = (sample.metadata or {}).get(METADATA_KEY) or {}
    turn = summary.get("turn")
    if not isinstance(turn, int):
        raise ValueError(
            f"sample {sample.index} has no metadata[{METADATA_KEY!r}]['turn']: trloo credit needs the turn "
            "samples of slime_ext's rollout (buffer or in-slime mode)"
        )
    return turn


def post_process(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's hook: (raw_rewards, rewards) for the flat list of samples."""
    raw = [float(s.get_reward_value(args)) for s in samples]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in NORMALISED_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    missing = [i for i, s in enumerate(samples) if s.group_index is None]
    if missing:
        raise ValueError(
            f"samples at positions {missing[:10]} have no group_index: cannot normalise by prompt group"
        )
    keep = [not s.remove_sample for s in samples]
    groups = [s.group_index for s in samples]
    if episode_config(args).reward.credit == "trloo":
        turns = [_turn(s) if k else -1 for s, k in zip(samples, keep, strict=True)]  # removed: no turn needed
        return raw, leave_one_out_by_turn(raw, groups, turns, keep)
    divide = estimator in STD_ESTIMATORS and getattr(args, "grpo_std_normalization", True)
    return raw, normalise_groups(raw, groups, keep, divide_by_std=divide)
