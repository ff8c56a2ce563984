"""Buffer mode: slime's rollout function reads whole GRPO groups from the rollout buffer server.

    --rollout-function-path slime_ext.slime_plugins.rollout.generate_rollout

`generate_rollout(args, rollout_id, data_source, evaluation=False)` is SYNC (slime calls it from
the RolloutManager actor). For training it:

0. on its first call in the process, has a resumed run's engines serve the resumed weights where
   slime's own push sent the reference model's (slime_ext.slime_plugins.resume_weights);
1. reports the policy version `rollout_id - policy_version_lag` to `POST /policy_version` (with
   train.py the engines hold the weights trained on rollouts 0..rollout_id-1 when rollout
   `rollout_id` is generated; train_async.py generates one step ahead: lag 1);
2. on first use, starts the buffer's agent runner (`POST /rollout/start`, idempotent); when slime
   offloads the engines between steps (`--colocate`, `--offload-rollout`; or
   `kernel_rl.plugins.pause_runner: true`), it starts the runner at every step and stops it
   (`POST /rollout/stop`: episodes in flight finish, or are cancelled when the buffer is
   on-policy) and then has slime abort what is left on its engines until they are idle (slime's
   own `abort_servers_until_idle`) before returning, so that no request reaches an engine whose
   memory slime releases for training (SGLang asserts an idle server there);
3. leases groups (`POST /batches`, long-poll) until it holds `--rollout-batch-size` groups and
   at least `--global-batch-size` trajectories (slime counts rollouts, not samples, per step and
   asserts at least one step; timed-out buffer groups may be smaller than n),
   converting each leased group to Samples (slime_ext.slime_plugins.samples) and acking the lease
   only after the conversion succeeded (a failure releases it and raises: nothing is lost);
4. returns `RolloutFnTrainOutput(samples, metrics)`: list[list[Sample]] (trajectory credit) or
   list[list[list[Sample]]] (per_turn credit: one inner list per trajectory, siblings sharing
   rollout_id), plus buffer metrics (`rollout/buffer/...`).

Group sizes: slime's default reward normalisation only groups correctly when every group has
exactly `--n-samples-per-prompt` samples; per_turn credit or a smaller (timed-out) buffer group
needs `--custom-reward-post-process-path slime_ext.slime_plugins.reward_post.post_process`,
which is checked here before anything is consumed.

With `evaluation=True` it runs episodes on held-out problems (`plugins.eval`) against slime's
SGLang router and the eval servers, and returns `RolloutFnEvalOutput` (see `evaluate`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eval_server.schema import EvalResult
from slime_ext.rollout.problems import PromptRecord, load_prompt_records
from slime_ext.rollout.rewards import RewardConfig, is_lazy, per_turn_samples
from slime_ext.slime_plugins import resume_weights
from slime_ext.slime_plugins.buffer_client import BufferClient, BufferError
from slime_ext.slime_plugins.config import PluginConfig, episode_config, plugin_config
from slime_ext.slime_plugins.resources import get_resources, run_problem
from slime_ext.slime_plugins.reward_post import HOOK_PATH, needs_group_hook
from slime_ext.slime_plugins.samples import episode_samples, group_to_samples
from slime_ext.slime_plugins.slime_api import (
    abort_engines_until_idle,
    eval_output,
    sample_class,
    train_output,
)
from slime_ext.trajectory.codec import decode
from slime_ext.trajectory.record import TrajectoryRecord

__all__ = ["evaluate", "generate_rollout", "reset_state", "runner_pauses"]

log = logging.getLogger(__name__)

POST_PROCESS_PATH = HOOK_PATH


@dataclass
class _BufferState:
    """Per buffer URL, for the life of the rollout actor."""

    client: BufferClient
    runner_started: bool = False
    reported_version: int | None = None
    next_group_index: int = 0
    next_index: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_states: dict[str, _BufferState] = {}
_states_lock = threading.Lock()


def _state(cfg: PluginConfig) -> _BufferState:
    url = cfg.resolved_buffer_url
    with _states_lock:
        if url not in _states:
            _states[url] = _BufferState(BufferClient(url, timeout_s=cfg.http_timeout_s))
        return _states[url]


def reset_state() -> None:
    """Forget every buffer connection and counter (tests; a new run in the same process)."""
    with _states_lock:
        for st in _states.values():
            st.client.close()
        _states.clear()
    resume_weights.reset()


def _check_group_shape(args: Any, instance_id: str, trajectories: int, per_turn: bool) -> None:
    if not needs_group_hook(args):
        return
    n = getattr(args, "n_samples_per_prompt", None)
    if per_turn or trajectories != n:
        why = (
            "per_turn credit fans out"
            if per_turn
            else f"group {instance_id!r} has {trajectories} trajectories"
        )
        raise ValueError(
            f"{why}, but slime's default reward normalisation needs exactly --n-samples-per-prompt ({n}) "
            f"samples per group: add --custom-reward-post-process-path {POST_PROCESS_PATH}"
        )


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function (see the module doc). `data_source` is not used in buffer mode."""
    cfg = plugin_config(args)
    if evaluation:
        return evaluate(args, rollout_id, cfg)
    credit = episode_config(args).reward.credit
    per_turn = per_turn_samples(credit)
    if per_turn:
        _check_group_shape(args, "", 0, per_turn=True)
    need = int(args.rollout_batch_size)
    st = _state(cfg)
    with st.lock:
        # a resumed run's engines serve the resumed weights before the runner generates (once)
        resume = resume_weights.ensure_resumed_weights(args, int(rollout_id))
        version = max(0, int(rollout_id) - cfg.policy_version_lag)
        if st.reported_version != version:
            st.client.set_policy_version(version)
            st.reported_version = version
        pause = cfg.start_runner and runner_pauses(args, cfg)
        if cfg.start_runner and (pause or not st.runner_started):
            try:
                st.client.start_runner()
            except BufferError as exc:
                raise BufferError(
                    f"could not start the buffer's agent runner ({exc}); start the buffer server with "
                    "--recipe, or set kernel_rl.plugins.start_runner: false if another producer writes "
                    "trajectories",
                    exc.status_code,
                ) from exc
            st.runner_started = True
        try:
            return _collect(args, cfg, st, need, credit, version, resume)
        finally:
            if pause:
                st.client.stop_runner()
                st.runner_started = False
                # an on-policy stop cancels episodes mid-generation (buffer_server/runner): their
                # requests must be gone before slime releases the engines' memory
                if getattr(args, "sglang_router_ip", None) and not getattr(args, "debug_train_only", False):
                    abort_engines_until_idle(args)


def runner_pauses(args: Any, cfg: PluginConfig) -> bool:
    """Whether the agent runner stops between steps: the setting, else whether slime offloads
    the engines while it trains (colocated engines always are)."""
    if cfg.pause_runner is not None:
        return cfg.pause_runner
    return bool(getattr(args, "colocate", False) or getattr(args, "offload_rollout", False))


def _collect(
    args: Any,
    cfg: PluginConfig,
    st: _BufferState,
    need: int,
    credit: str,
    version: int,
    extra: Mapping[str, float] | None = None,
) -> Any:
    """Lease groups until the step has them; `extra` joins the step's metrics."""
    started = time.monotonic()
    deadline = started + cfg.max_wait_s
    # slime trains num_rollouts // --global-batch-size steps and asserts at least one: with
    # smaller (timed-out) groups, keep leasing until there are that many trajectories.
    need_trajectories = int(getattr(args, "global_batch_size", None) or 0)
    groups: list[list[Any]] = []
    records = leases = trajectories = prs_dropped = 0
    reward = episode_config(args).reward
    staleness: list[int] = []
    while len(groups) < need or trajectories < need_trajectories:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            stats = _stats_summary(st.client)
            raise TimeoutError(
                f"rollout buffer {st.client.url}: {len(groups)} of {need} groups ({trajectories} of "
                f"{need_trajectories} trajectories) after {cfg.max_wait_s:g} s (kernel_rl.plugins.max_wait_s); "
                f"buffer stats: {stats}"
            )
        reply = st.client.lease(
            max(1, need - len(groups)), timeout_s=min(cfg.batch_wait_s, remaining), lease_s=cfg.lease_s
        )
        if not reply.get("groups"):
            why = runner_exhausted(_stats_or_none(st.client))
            if why is not None:
                raise RuntimeError(
                    f"rollout buffer {st.client.url}: this step has {len(groups)} of its {need} groups and "
                    f"no more can come: {why}. Raise kernel_rl.runner.epochs in the recipe, or lower "
                    "NUM_ROLLOUT (slime's --num-rollout)"
                )
            continue
        lease_id = reply["lease_id"]
        try:
            converted = []
            index = st.next_index
            for g, group in enumerate(reply["groups"]):
                recs = [_decode(body, f"groups[{g}].records[{i}]") for i, body in enumerate(group["records"])]
                kept = [r for r in recs if not lazy_record(r, reward)]
                prs_dropped += len(recs) - len(kept)
                staleness += [version - r.policy_version for r in recs]
                records += len(recs)
                if not kept:
                    continue
                recs = kept
                samples, index = group_to_samples(
                    recs, credit=credit, group_index=st.next_group_index + len(converted), first_index=index
                )
                _check_group_shape(
                    args, group["instance_id"], len(samples), per_turn=per_turn_samples(credit)
                )
                converted.append(samples)
        except BaseException:
            st.client.release(lease_id)
            raise
        st.client.ack(lease_id)
        leases += 1
        st.next_index = index
        st.next_group_index += len(converted)
        groups.extend(converted)
        trajectories += sum(len(g) for g in converted)
    metrics = {
        "rollout/buffer/wait_s": time.monotonic() - started,
        "rollout/buffer/groups": float(len(groups)),
        "rollout/buffer/trajectories": float(trajectories),
        "rollout/buffer/records": float(records),
        "rollout/buffer/leases": float(leases),
        "rollout/buffer/policy_version": float(version),
        "rollout/buffer/staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "rollout/buffer/staleness_max": float(max(staleness, default=0)),
        "rollout/buffer/prs_dropped": float(prs_dropped),
        **(extra or {}),
    }
    return train_output(groups, metrics)


def lazy_record(record: TrajectoryRecord, reward: RewardConfig) -> bool:
    """Profiling-based rejection (rewards.is_lazy): whether the record's last evaluated turn is a
    correct kernel that spent too little of its GPU time in its own kernels."""
    if reward.prs_min_share is None:
        return False
    last = next((t for t in reversed(record.turn_eval_results) if t is not None), None)
    return last is not None and is_lazy(EvalResult.from_json(last), reward)


def _decode(body: bytes, path: str) -> TrajectoryRecord:
    try:
        return decode(body)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def runner_exhausted(stats: Mapping[str, Any] | None) -> str | None:
    """Why no group can come any more, from the buffer's /stats: its agent runner has run every
    group of its epochs and the buffer holds no record (none ready, partial or leased); None
    while more can come (or the stats are unknown). Without it a run whose steps need more groups
    than the runner's epochs make waited out max_wait_s (an hour by default) at its last step."""
    if not stats:
        return None
    runner, records = stats.get("runner") or {}, stats.get("records") or {}
    if not runner.get("finished") or records.get("stored") != 0:
        return None
    return (
        f"the agent runner has run every group of its {runner.get('epochs')} epoch(s) over "
        f"{runner.get('prompts')} prompt(s) and the buffer holds no records"
    )


def _stats_or_none(client: BufferClient) -> dict[str, Any] | None:
    try:
        return client.stats()
    except BufferError:
        return None


def _stats_summary(client: BufferClient) -> Any:
    try:
        stats = client.stats()
    except BufferError as exc:
        return f"unavailable ({exc})"
    return {k: stats.get(k) for k in ("records", "groups", "policy_version", "runner", "dropped_groups")}


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class _EvalSet:
    name: str
    problems: list[PromptRecord]
    n: int
    temperature: float
    max_new_tokens: int | None


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _eval_sets(args: Any, cfg: PluginConfig) -> list[_EvalSet]:
    """slime's eval datasets (`--eval-prompt-data name path ...` / `--eval-config`: each path a
    prompt-record jsonl), else `plugins.eval.prompt_data`; records filtered by `plugins.eval.split`
    and cut to `plugins.eval.max_problems`."""
    settings = cfg.eval
    default_n = _first(getattr(args, "n_samples_per_eval_prompt", None), settings.n_samples_per_prompt)
    default_t = _first(
        settings.temperature, getattr(args, "eval_temperature", None), args.rollout_temperature
    )
    default_len = _first(
        getattr(args, "eval_max_response_len", None), getattr(args, "rollout_max_response_len", None)
    )
    specs = [
        (ds.name, ds.path, _first(getattr(ds, "n_samples_per_eval_prompt", None), default_n),
         _first(settings.temperature, getattr(ds, "temperature", None), default_t),
         _first(getattr(ds, "max_response_len", None), default_len))
        for ds in getattr(args, "eval_datasets", None) or []
    ]  # fmt: skip
    if not specs and settings.prompt_data:
        specs = [(settings.name, settings.prompt_data, settings.n_samples_per_prompt, default_t, default_len)]
    if not specs:
        raise ValueError(
            "evaluation needs prompt records: --eval-prompt-data NAME PATH (a prompt-record jsonl) or "
            "kernel_rl.plugins.eval.prompt_data"
        )
    out = []
    for name, path, n, temperature, max_new in specs:
        records = [r for r in load_prompt_records(path) if settings.split in (None, r.split)]
        if settings.max_problems is not None:
            records = records[: settings.max_problems]
        if not records:
            raise ValueError(
                f"{path}: no prompt record with split {settings.split!r} (kernel_rl.plugins.eval.split)"
            )
        out.append(_EvalSet(name, records, int(n), float(temperature), max_new))
    return out


async def _evaluate_async(args: Any, cfg: PluginConfig, ev: _EvalSet) -> list[Any]:
    episode = episode_config(args)
    res = await get_resources(args, cfg, episode, temperature=ev.temperature, evaluation=True)
    gate = asyncio.Semaphore(cfg.eval.concurrency)
    Sample = sample_class()

    async def one(p: int, record: PromptRecord, j: int) -> Any:
        async with gate:
            ep = await run_problem(record, res, episode, max_new_tokens=ev.max_new_tokens)
        base = Sample(group_index=p, index=p * ev.n + j, prompt=record.reference, label=record.instance_id)
        info = {"instance_id": record.instance_id, "level": record.level, "problem_id": record.problem_id}
        return episode_samples(ep, base, credit="trajectory", info=info, evaluation=True)

    try:
        return list(
            await asyncio.gather(*(one(p, r, j) for p, r in enumerate(ev.problems) for j in range(ev.n)))
        )
    finally:
        await res.aclose()


def evaluate(args: Any, rollout_id: int, cfg: PluginConfig | None = None) -> Any:
    """The evaluation=True path: `n` episodes per held-out problem of each eval set (see
    `_eval_sets`), trajectory return as reward, against slime's router and the eval servers.
    Returns `RolloutFnEvalOutput({name: {"rewards", "truncated", "samples"}}, metrics)`; aborted
    episodes (engine abort, eval outage) are left out of rewards and samples and counted in the
    metrics (`eval/<name>/aborted`)."""
    cfg = cfg or plugin_config(args)
    data: dict[str, dict[str, Any]] = {}
    metrics: dict[str, float] = {}
    for ev in _eval_sets(args, cfg):
        started = time.monotonic()
        samples = asyncio.run(_evaluate_async(args, cfg, ev))
        kept = [s for s in samples if s.status.name != "ABORTED"]
        data[ev.name] = {
            "rewards": [s.reward for s in kept],
            "truncated": [s.status.name == "TRUNCATED" for s in kept],
            "samples": kept,
        }
        metrics[f"eval/{ev.name}/episodes"] = float(len(samples))
        metrics[f"eval/{ev.name}/aborted"] = float(len(samples) - len(kept))
        metrics[f"eval/{ev.name}/time_s"] = time.monotonic() - started
        log.info("eval %s at rollout %d: %d episodes, %d aborted", ev.name, rollout_id, len(samples),
                 len(samples) - len(kept))  # fmt: skip
    return eval_output(data, metrics)
