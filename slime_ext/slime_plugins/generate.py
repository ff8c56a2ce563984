"""In-slime (on-policy) mode: the multi-turn episode inside slime's own rollout loop.

    --custom-generate-function-path slime_ext.slime_plugins.generate.generate
    --custom-rm-path                slime_ext.slime_plugins.generate.reward

slime's default rollout draws prompts from `--prompt-data` (the prompt-record jsonl, read with
`--input-key reference`, no `--apply-chat-template`: `sample.prompt` is then the reference source)
and calls `generate(args, sample, sampling_params)` once per sample, inside its semaphore. The
episode (slime_ext.rollout.episode.run_episode) runs against slime's SGLang router and the eval servers;
the reward is set here, so slime keeps it and calls the RM only for samples without one.

Returns (slime_interfaces.md section 1): `trajectory` credit -> the sample itself (tokens = prompt
+ whole multi-turn response, reward R); `per_turn` credit -> a list of Samples, one per turn,
sharing `rollout_id` (= the sample's index) so slime counts them as one rollout. Status:
completed/truncated/aborted -> COMPLETED/TRUNCATED/ABORTED; an aborted episode gets reward 0 and
`remove_sample=True` (slime skips the RM for ABORTED and would otherwise fail on a None reward).
SGLang errors other than abort propagate, like slime's own generate.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime_ext.rollout.rewards import per_turn_samples
from slime_ext.slime_plugins.config import episode_config, plugin_config
from slime_ext.slime_plugins.resources import get_resources, problem_index, problem_info, run_problem
from slime_ext.slime_plugins.resume_weights import ensure_resumed_weights, resume_checked
from slime_ext.slime_plugins.reward_post import HOOK_PATH, needs_group_hook
from slime_ext.slime_plugins.samples import episode_samples
from slime_ext.trajectory.record import STATUS_ABORTED

__all__ = ["generate", "reward"]

log = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"


def _reset(sample: Any) -> None:
    """A sample slime recycles (partial rollout) arrives ABORTED with old fields: start over."""
    sample.tokens = []
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.reward = None
    sample.remove_sample = False


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate: run one episode for `sample`; returns a Sample or list[Sample]."""
    if getattr(args, "group_rm", False):
        raise ValueError(
            "--group-rm is not supported with the kernel_rl generate: the reward is set in generate"
        )
    if not isinstance(sample.prompt, str) or not sample.prompt.strip():
        raise ValueError(
            "sample.prompt must be the reference source (prompt data read with --input-key reference and "
            f"without --apply-chat-template), got {type(sample.prompt).__name__}"
        )
    cfg = plugin_config(args)
    episode = episode_config(args)
    if not resume_checked():  # a resumed run's engines serve the resumed weights first (once)
        await asyncio.to_thread(ensure_resumed_weights, args, None)
    if not evaluation and per_turn_samples(episode.reward.credit) and needs_group_hook(args):
        raise ValueError(
            f"{episode.reward.credit} credit returns several samples per prompt sample; slime's default reward "
            f"normalisation would then treat the whole batch as one group: add --custom-reward-post-process-path "
            f"{HOOK_PATH}"
        )
    temperature = sampling_params.get("temperature", getattr(args, "rollout_temperature", None))
    if temperature is None:
        raise ValueError("no sampling temperature (sampling_params and args.rollout_temperature unset)")
    res = await get_resources(args, cfg, episode, temperature=float(temperature), evaluation=evaluation)
    if cfg.prompt_data:  # read the file off the event loop (once; cached afterwards)
        await asyncio.to_thread(problem_index, cfg.prompt_data)
    problem, info = problem_info(sample.prompt, cfg, label=sample.label, metadata=sample.metadata)
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {ROUTING_HEADER: sample.session_id}

    _reset(sample)
    ep = await run_problem(
        problem, res, episode, max_new_tokens=sampling_params.get("max_new_tokens"), headers=headers
    )
    if ep.status == STATUS_ABORTED:
        log.warning("episode for %s aborted: %s", info["instance_id"], ep.abort_reason)
    # Evaluation reports the trajectory return per episode, whatever the training credit mode.
    credit = "trajectory" if evaluation else episode.reward.credit
    # Eval samples from slime's eval_rollout carry `index` but no `group_index`.
    return episode_samples(ep, sample, credit=credit, info=info, evaluation=evaluation)


async def reward(args: Any, sample: Any, **kwargs: Any) -> Any:
    """slime's custom RM: the reward generate already set.

    The parameter is named `sample` as in slime's RM contract (`async_rm(args, sample)`); slime's
    `batched_async_rm` passes a list in the same position (after a list-returning generate), so
    both shapes are accepted. slime calls the RM only for samples whose reward is None, which never
    happens after this generate; a None here means another generate produced the sample, which is
    a setup error.
    """
    items = sample if isinstance(sample, list) else [sample]
    missing = [getattr(s, "index", None) for s in items if s.reward is None]
    if missing:
        raise ValueError(
            f"samples {missing} have no reward: slime_ext.slime_plugins.generate.reward only returns the "
            "reward set by slime_ext.slime_plugins.generate.generate (use both flags together)"
        )
    values = [s.reward for s in items]
    return values if isinstance(sample, list) else values[0]
