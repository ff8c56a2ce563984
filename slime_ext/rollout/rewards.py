"""Turn rewards, discounted returns and the early-stop rule (one place for the whole scoring).

Per-turn reward `r_t` from one evaluation (defaults, all in `RewardConfig`):

| outcome | reward |
|---|---|
| no fenced python block (nothing evaluated) | 0 |
| any check with severity `reject`, or status `rejected` | 0 |
| `timeout`, `crashed`, `compile_error`, `reference_error`, `server_error` | 0 |
| compiled but not correct (`incorrect`, `runtime_error` with `compiled`) | 0.1 |
| correct | 0.3 |
| correct and timed with speedup s > 1 | 0.3 + min(s - 1, 2.0) |

A result carrying the `runtime.excessive_speedup` warning (the evaluator re-verified and re-timed a
speedup above its threshold, typically 10x, and kept the slower timing) gets its speedup bonus
capped at `excessive_speedup_bonus_cap` (default 2.0, i.e. the same as the general cap, so by
default the warning changes nothing; lower it, e.g. to 0, to distrust such speedups).

Returns with discount `gamma` (default 0.4, the Kevin-32B value):
- `trajectory` credit: one number per episode, R = sum_t gamma^t r_t (= G_0).
- `per_turn` credit: every turn is its own sample with G_t = sum_{k>=t} gamma^(k-t) r_k.
- `trloo` credit: the samples of `per_turn`; the advantage of turn t is G_t minus the mean G_t of
  the prompt's other trajectories at turn t (turn-level REINFORCE leave-one-out, Dr. Kernel,
  arXiv 2602.05885), computed by the reward post-process (slime_plugins/reward_post.py).

Profiling-based reward and rejection (Dr. Kernel's PR and PRS, against lazy optimization; both off
by default): where the evaluator profiled the forward (`result.kernel_time`, GPU only),
`profile_scale` multiplies the speedup bonus by the share of the forward's GPU time spent in the
candidate's own kernels, and `prs_min_share` marks a correct turn below that share as lazy
(`is_lazy`): the rollout function drops trajectories whose last evaluated turn is lazy from the
training batch and counts them (`rollout/buffer/prs_dropped`).

Speedup baseline (`baseline`): `eager` (default) rewards `speedup`, against the PyTorch reference
as written; `compile` rewards `speedup_vs_compile`, against the reference through `torch.compile`
(the eval request then asks for it, `options.baseline_compile`; where torch.compile fails for a
problem the evaluator says so and the eager speedup stands in). The early stop reads the same one.

Early stop (default): stop the episode after a turn that is correct with speedup >= 2.0. On CPU
(no timing, speedup null) it never triggers unless `early_stop_min_speedup` is None, which stops
on any correct turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eval_server.schema import STATUS_INCORRECT, STATUS_OK, STATUS_REJECTED, STATUS_RUNTIME_ERROR, EvalResult

__all__ = [
    "BASELINES",
    "CREDIT_MODES",
    "EXCESSIVE_SPEEDUP_CHECK",
    "RewardConfig",
    "discounted_returns",
    "per_turn_samples",
    "episode_returns",
    "rewarded_speedup",
    "is_lazy",
    "is_rejected",
    "should_stop",
    "trajectory_return",
    "turn_reward",
]

EXCESSIVE_SPEEDUP_CHECK = "runtime.excessive_speedup"
CREDIT_MODES = ("trajectory", "per_turn", "trloo")
BASELINES = ("eager", "compile")


@dataclass(frozen=True)
class RewardConfig:
    no_code: float = 0.0
    failed: float = 0.0  # rejected, timeout, crashed, compile_error, ... (nothing usable)
    compiled: float = 0.1  # compiled, ran or tried to run, not correct
    correct: float = 0.3
    max_speedup_bonus: float = 2.0  # bonus = min(max(speedup - 1, 0), max_speedup_bonus)
    excessive_speedup_bonus_cap: float = 2.0  # bonus cap when runtime.excessive_speedup fired
    # Statuses that earn `compiled` when result.compiled is true and the result is not correct.
    compiled_statuses: tuple[str, ...] = (STATUS_INCORRECT, STATUS_RUNTIME_ERROR)
    gamma: float = 0.4
    credit: str = "trajectory"  # "trajectory" | "per_turn" | "trloo"
    early_stop_on_correct: bool = True
    early_stop_min_speedup: float | None = 2.0  # None: any correct turn stops the episode
    profile_scale: bool = False  # speedup bonus x the share of GPU time in the candidate's kernels
    prs_min_share: float | None = None  # drop trajectories whose last correct turn is below this share
    baseline: str = "eager"  # the speedup rewarded: "eager" (speedup) | "compile" (speedup_vs_compile)

    def __post_init__(self) -> None:
        if self.credit not in CREDIT_MODES:
            raise ValueError(f"credit must be one of {CREDIT_MODES}, got {self.credit!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.max_speedup_bonus < 0 or self.excessive_speedup_bonus_cap < 0:
            raise ValueError("speedup bonus caps must be >= 0")
        if self.prs_min_share is not None and not 0.0 < self.prs_min_share <= 1.0:
            raise ValueError(f"prs_min_share must be in (0, 1] or null, got {self.prs_min_share}")


def per_turn_samples(credit: str) -> bool:
    """Whether a credit mode trains one sample per turn (per_turn, trloo) rather than one per episode."""
    return credit != "trajectory"


def is_rejected(result: EvalResult) -> bool:
    """True when an anti-cheat check rejected the candidate (any check with severity reject)."""
    return result.status == STATUS_REJECTED or any(c.severity == "reject" for c in result.checks)


def rewarded_speedup(result: EvalResult, config: RewardConfig) -> float | None:
    """The speedup against the configured baseline (null when not measured)."""
    return result.speedup_vs_compile if config.baseline == "compile" else result.speedup


def speedup_bonus(result: EvalResult, config: RewardConfig) -> float:
    speedup = rewarded_speedup(result, config)
    if speedup is None:
        return 0.0
    cap = config.max_speedup_bonus
    if any(c.id == EXCESSIVE_SPEEDUP_CHECK for c in result.checks):
        cap = min(cap, config.excessive_speedup_bonus_cap)
    bonus = min(max(speedup - 1.0, 0.0), cap)
    if config.profile_scale and result.kernel_time is not None:
        bonus *= result.kernel_time.own_share
    return bonus


def is_lazy(result: EvalResult | None, config: RewardConfig) -> bool:
    """Whether a correct, profiled turn spent less than `prs_min_share` of its forward's GPU time
    in its own kernels (never without the setting or a profile)."""
    if config.prs_min_share is None or result is None or result.kernel_time is None:
        return False
    correct = result.correct and result.status == STATUS_OK and not is_rejected(result)
    return correct and result.kernel_time.own_share < config.prs_min_share


def turn_reward(result: EvalResult | None, config: RewardConfig | None = None) -> float:
    """Reward of one turn; `result` None means the response had no code to evaluate."""
    config = config or RewardConfig()
    if result is None:
        return config.no_code
    if is_rejected(result):
        return config.failed
    if result.correct and result.status == STATUS_OK:
        return config.correct + speedup_bonus(result, config)
    if result.compiled and result.status in config.compiled_statuses:
        return config.compiled
    return config.failed


def should_stop(result: EvalResult | None, config: RewardConfig | None = None) -> bool:
    """Early-stop rule: stop after a correct turn that is fast enough (see module doc)."""
    config = config or RewardConfig()
    if result is None or not config.early_stop_on_correct:
        return False
    if not (result.correct and result.status == STATUS_OK) or is_rejected(result):
        return False
    if config.early_stop_min_speedup is None:
        return True
    speedup = rewarded_speedup(result, config)
    return speedup is not None and speedup >= config.early_stop_min_speedup


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = sum_{k>=t} gamma^(k-t) r_k for every turn t."""
    returns = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def trajectory_return(rewards: Sequence[float], gamma: float) -> float:
    """R = sum_t gamma^t r_t (0.0 for an episode without turns)."""
    return sum(r * gamma**t for t, r in enumerate(rewards))


def episode_returns(rewards: Sequence[float], config: RewardConfig | None = None) -> list[float]:
    """What each training sample gets: [R] in trajectory mode, [G_0, ..., G_{T-1}] per turn."""
    config = config or RewardConfig()
    if config.credit == "trajectory":
        return [trajectory_return(rewards, config.gamma)]
    return discounted_returns(rewards, config.gamma)
