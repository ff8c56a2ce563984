"""Trajectory records and episodes -> slime `Sample`s, with slime's Sample invariants checked here.

Both plug-in modes end in `fill_sample`, so the invariants hold by construction and are checked
once more by `check_sample` (slime_interfaces.md section 2):

- `tokens == prompt_ids + response_ids` (prompt length P >= 1) and `response_length >= 1`;
- `len(loss_mask) == response_length == len(rollout_log_probs)`; mask values 0/1, log-probs
  finite and 0.0 where the mask is 0;
- `reward` is a finite number (never None: slime normalises rewards after the rollout);
- `status` is COMPLETED, TRUNCATED or ABORTED (never PENDING);
- `index`, `group_index` and `rollout_id` are ints; fan-out siblings (per_turn credit: the turn
  samples of one trajectory) share `index`, `group_index` and `rollout_id` (= the trajectory's
  index), as slime's own agent fan-out does. Evaluation samples are the one exception: slime's
  `eval_rollout` sets `index` on each eval sample but never `group_index` (eval samples are not
  normalised by group), so with `evaluation=True` `group_index` may be None.

An aborted episode (engine abort, eval outage) trains nothing: reward 0.0, `remove_sample=True`,
mask all 0. If it has no response token at all, the last prompt token is counted as its one
(masked) response token, so no token is invented and `response_length >= 1` still holds.

Per-turn records in the buffer (buffer_server/runner/agent_runner.py `episode_records`): the records of one
trajectory carry the same `metadata["episode_uid"]` (TRAJECTORY_KEY), their turn in
`sample_index` and only that turn's reward and eval result; a record without that key is a
trajectory of its own.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from slime_ext.rollout.episode import Episode, episode_to_samples_per_turn
from slime_ext.rollout.rewards import per_turn_samples
from slime_ext.slime_plugins.slime_api import sample_class
from slime_ext.trajectory.record import STATUS_ABORTED, STATUS_COMPLETED, STATUS_TRUNCATED, TrajectoryRecord

__all__ = [
    "METADATA_KEY",
    "TRAJECTORY_KEY",
    "SampleInvariantError",
    "check_sample",
    "episode_samples",
    "fill_sample",
    "group_to_samples",
    "record_sample",
    "turn_summary",
]

TRAJECTORY_KEY = "episode_uid"  # record.metadata key tying the per-turn records of one trajectory
METADATA_KEY = "kernel_rl"  # Sample.metadata key holding the summary the rollout log function reads

# trajectory-record / episode status -> slime Sample.Status member name
_STATUS_NAMES = {STATUS_COMPLETED: "COMPLETED", STATUS_TRUNCATED: "TRUNCATED", STATUS_ABORTED: "ABORTED"}


class SampleInvariantError(ValueError):
    """A Sample that slime would reject or mis-train; the message names the field."""


def turn_summary(
    eval_result: Mapping[str, Any] | None, reward: float, role: str | None = None
) -> dict[str, Any]:
    """What the rollout metrics need from one turn (the full eval result stays in the buffer);
    `role` (slime_ext/rollout/roles.py) where the episode recorded it."""
    r = eval_result or {}
    speedup, kernel_time, phases = r.get("speedup"), r.get("kernel_time"), r.get("phases")
    summary = {
        "evaluated": eval_result is not None,
        "status": r.get("status"),
        "compiled": bool(r.get("compiled")),
        "correct": bool(r.get("correct")) and r.get("status") == "ok",
        "speedup": None if speedup is None else float(speedup),
        # share of the profiled forward's GPU time in the candidate's kernels (GPU only)
        "own_share": float(kernel_time["own_share"]) if isinstance(kernel_time, Mapping) else None,
        "eval_s": r.get("elapsed_s"),
        # the eval server's seconds per phase (compile, correctness, timing, ...): where eval_s went
        "phases": {str(k): float(v) for k, v in phases.items()} if isinstance(phases, Mapping) else {},
        "reward": float(reward),
        # the check ids that ended a turn that was not ok (static rules, runtime checks, the judge)
        "checks": [str(c.get("id")) for c in r.get("checks") or [] if isinstance(c, Mapping)]
        if r.get("status") not in (None, "ok")
        else [],
    }
    if role is not None:
        summary["role"] = role
    return summary


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_sample(sample: Any, *, evaluation: bool = False) -> None:
    """Raise SampleInvariantError unless `sample` satisfies every invariant in the module doc.

    `evaluation`: the sample comes from slime's eval path, which leaves `group_index` None."""
    where = f"sample index={sample.index}"
    for name in ("index", "group_index", "rollout_id"):
        value = getattr(sample, name)
        if name == "group_index" and evaluation and value is None:
            continue
        if not _is_int(value):
            kind = "an int" if name != "group_index" else "an int (None only for evaluation samples)"
            raise SampleInvariantError(f"{where}: {name} must be {kind}, got {value!r}")
    n = sample.response_length
    if not isinstance(n, int) or n < 1:
        raise SampleInvariantError(f"{where}: response_length must be >= 1, got {n!r}")
    if len(sample.tokens) - n < 1:
        raise SampleInvariantError(
            f"{where}: tokens ({len(sample.tokens)}) leave no prompt before the response ({n})"
        )
    if sample.loss_mask is None or len(sample.loss_mask) != n:
        raise SampleInvariantError(f"{where}: len(loss_mask) != response_length {n}")
    if sample.rollout_log_probs is None or len(sample.rollout_log_probs) != n:
        raise SampleInvariantError(f"{where}: len(rollout_log_probs) != response_length {n}")
    for i, (m, lp) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True)):
        if m not in (0, 1) or isinstance(m, bool):
            raise SampleInvariantError(f"{where}: loss_mask[{i}] must be 0 or 1, got {m!r}")
        if not math.isfinite(lp) or (m == 0 and lp != 0.0):
            raise SampleInvariantError(
                f"{where}: rollout_log_probs[{i}]={lp!r} (must be finite, 0.0 where mask 0)"
            )
    reward = sample.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise SampleInvariantError(f"{where}: reward must be a finite number, got {reward!r}")
    status = getattr(sample.status, "name", None)
    if status not in _STATUS_NAMES.values():
        raise SampleInvariantError(
            f"{where}: status must be COMPLETED, TRUNCATED or ABORTED, got {sample.status}"
        )
    if status == "ABORTED" and (not sample.remove_sample or any(sample.loss_mask)):
        raise SampleInvariantError(f"{where}: an aborted sample must be removed (remove_sample, mask all 0)")


def fill_sample(
    sample: Any,
    *,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    loss_mask: Sequence[int],
    rollout_log_probs: Sequence[float],
    reward: float,
    status: str,
    response: str = "",
    metadata: Mapping[str, Any] | None = None,
    evaluation: bool = False,
) -> Any:
    """Set the training fields of `sample` (other fields, e.g. prompt, label, session_id, are
    kept), apply the aborted-sample rule, check the invariants and return the sample.
    `evaluation`: an eval sample (see `check_sample`)."""
    if status not in _STATUS_NAMES:
        raise SampleInvariantError(f"status {status!r} is not one of {sorted(_STATUS_NAMES)}")
    prompt, resp = [int(t) for t in prompt_ids], [int(t) for t in response_ids]
    mask, logprobs = [int(m) for m in loss_mask], [float(x) for x in rollout_log_probs]
    if not (len(resp) == len(mask) == len(logprobs)):
        raise SampleInvariantError(
            f"response {len(resp)}, loss_mask {len(mask)} and rollout_log_probs {len(logprobs)} differ in length"
        )
    aborted = status == STATUS_ABORTED
    if aborted:
        reward, mask, logprobs = 0.0, [0] * len(resp), [0.0] * len(resp)
        if not resp:  # nothing generated: count the last prompt token as the (masked) response
            if len(prompt) < 2:
                raise SampleInvariantError(
                    "an aborted episode without response needs a prompt of >= 2 tokens"
                )
            prompt, resp, mask, logprobs = prompt[:-1], prompt[-1:], [0], [0.0]
    sample.tokens = prompt + resp
    sample.response_length = len(resp)
    sample.loss_mask = mask
    sample.rollout_log_probs = logprobs
    sample.response = response
    sample.reward = float(reward)
    sample.status = getattr(sample_class().Status, _STATUS_NAMES[status])
    sample.remove_sample = aborted
    if metadata:
        sample.metadata = {**(sample.metadata or {}), **metadata}
    check_sample(sample, evaluation=evaluation)
    return sample


def _turns(record: TrajectoryRecord) -> list[dict[str, Any]]:
    roles = record.metadata.get("roles")
    if not (isinstance(roles, list) and len(roles) == len(record.turn_eval_results)):
        roles = [None] * len(record.turn_eval_results)  # records written before roles existed
    return [
        turn_summary(r, rw, role)
        for r, rw, role in zip(record.turn_eval_results, record.turn_rewards, roles, strict=True)
    ]


def _record_metadata(
    record: TrajectoryRecord, *, turn: int | None, turns: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    meta = record.metadata
    return {
        METADATA_KEY: {
            "instance_id": record.instance_id,
            "level": meta.get("level"),
            "problem_id": meta.get("problem_id"),
            "trajectory": str(meta.get(TRAJECTORY_KEY) or record.uid),
            "turn": turn,
            "turns": turns,
            "status": status,
            "early_stopped": bool(meta.get("early_stopped", False)),
            "timing": _timing(meta.get("timing")),
            "policy_version": record.policy_version,
            "uid": record.uid,
        }
    }


def record_sample(
    record: TrajectoryRecord,
    *,
    group_index: int,
    index: int,
    turn: int | None = None,
    trajectory: Sequence[TrajectoryRecord] | None = None,
) -> Any:
    """One record -> one Sample (rollout_id = index: fan-out siblings get the same index).

    `turn`/`trajectory`: per_turn credit, the record's turn and every record of its trajectory
    in turn order (each per-turn record holds only its own turn's result; the metadata summary
    covers the whole trajectory)."""
    recs = list(trajectory) if trajectory else [record]
    turns = [t for r in recs for t in _turns(r)]
    sample = sample_class()(group_index=group_index, index=index, rollout_id=index, label=record.instance_id)
    return fill_sample(
        sample,
        prompt_ids=record.prompt_token_ids,
        response_ids=record.response_token_ids,
        loss_mask=record.loss_mask,
        rollout_log_probs=record.rollout_log_probs,
        reward=record.reward,
        status=record.status,
        metadata=_record_metadata(record, turn=turn, turns=turns, status=recs[-1].status),
    )


def group_to_samples(
    records: Sequence[TrajectoryRecord], *, credit: str, group_index: int, first_index: int
) -> tuple[list[Any], int]:
    """The records of one GRPO group -> (samples, next free index).

    `trajectory` credit: list[Sample], one per record (two records of one trajectory are an error).
    `per_turn` credit: list[list[Sample]], one inner list per trajectory (records tied by
    TRAJECTORY_KEY, ordered by `sample_index`), every sibling with the trajectory's index.
    """
    trajectories: dict[str, list[TrajectoryRecord]] = {}
    for rec in records:
        trajectories.setdefault(str(rec.metadata.get(TRAJECTORY_KEY) or rec.uid), []).append(rec)
    out: list[Any] = []
    index = first_index
    for key, recs in trajectories.items():
        if per_turn_samples(credit):
            recs = sorted(recs, key=lambda r: r.sample_index)
            out.append(
                [
                    record_sample(
                        r, group_index=group_index, index=index, turn=r.sample_index, trajectory=recs
                    )
                    for r in recs
                ]
            )
        else:
            if len(recs) > 1:
                raise SampleInvariantError(
                    f"{len(recs)} records of trajectory {key!r} but credit is 'trajectory' (one record per "
                    "trajectory): the recipe's episode.reward.credit differs from what the runner wrote"
                )
            out.append(record_sample(recs[0], group_index=group_index, index=index))
        index += 1
    return out, index


def _timing(value: Any) -> dict[str, float] | None:
    """The episode's seconds (`total_s`, `generate_s`, `eval_s`) where its writer recorded them."""
    if not isinstance(value, Mapping):
        return None
    return {k: float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _episode_metadata(ep: Episode, base: Mapping[str, Any], turn: int | None) -> dict[str, Any]:
    turns = [turn_summary(t.eval_result, t.reward, t.role) for t in ep.turns]
    return {
        METADATA_KEY: {
            **base,
            "turn": turn,
            "turns": turns,
            "status": ep.status,
            "abort_reason": ep.abort_reason,
            "early_stopped": ep.early_stopped,
            "timing": _timing(ep.timing),
        }
    }


def episode_samples(
    ep: Episode, base_sample: Any, *, credit: str, info: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """An episode run inside slime's loop -> the Sample to return from custom generate.

    `trajectory` credit: `base_sample` filled with the whole episode, reward R.
    `per_turn` credit: a list, one Sample per turn (context = prompt + earlier turns and feedback,
    response = that turn's sampled tokens, reward G_t), all sharing the base sample's index,
    group_index and rollout_id. An aborted episode is one removed sample (a one-element list in
    per_turn mode, so the shape never depends on the outcome).
    `info` goes into `metadata["kernel_rl"]` (instance_id, level, ...). `evaluation`: the base
    sample comes from slime's eval path (its `group_index` may be None, see `check_sample`).
    """
    if base_sample.rollout_id is None:
        base_sample.rollout_id = base_sample.index
    if not per_turn_samples(credit) or ep.status == STATUS_ABORTED or not ep.turns:
        sample = fill_sample(
            base_sample,
            prompt_ids=ep.prompt_ids,
            response_ids=ep.response_ids,
            loss_mask=ep.loss_mask,
            rollout_log_probs=ep.rollout_log_probs,
            reward=ep.reward,
            status=ep.status,
            response="".join(t.text for t in ep.turns),
            metadata=_episode_metadata(ep, info, None),
            evaluation=evaluation,
        )
        return [sample] if per_turn_samples(credit) else sample
    per_turn = episode_to_samples_per_turn(ep)
    # copies before the base is filled: siblings keep its identity (index, group, rollout_id, ...)
    targets = [base_sample] + [copy.deepcopy(base_sample) for _ in per_turn[1:]]
    out = []
    last = len(ep.turns) - 1
    for ts, sample in zip(per_turn, targets, strict=True):
        # The whole episode's status is the last turn's; earlier turns ended normally.
        status = ep.status if ts.turn == last else STATUS_COMPLETED
        out.append(
            fill_sample(
                sample,
                prompt_ids=ts.prompt_ids,
                response_ids=ts.response_ids,
                loss_mask=ts.loss_mask,
                rollout_log_probs=ts.rollout_log_probs,
                reward=ts.ret,
                status=status,
                response=ep.turns[ts.turn].text,
                metadata=_episode_metadata(ep, info, ts.turn),
                evaluation=evaluation,
            )
        )
    return out
