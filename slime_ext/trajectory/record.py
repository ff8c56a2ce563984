"""The one definition of the trajectory record: what the rollout side writes to the buffer
server and what the trainer side reads back.

One record is one training sample: the prompt and response token ids exactly as sampled (nothing
is re-tokenized from text), which response tokens the model sampled (`loss_mask`), their
log-probabilities at sampling time, the per-turn rewards and evaluation results of a multi-turn
episode, and the final reward. Records with the same `instance_id` form one GRPO group.

Validation is hand-written like `eval_server.schema`: `parse_record` takes a decoded JSON object
and either returns a TrajectoryRecord or raises ValidationError whose message names the field
(and, for lists, the index), e.g. `records[3].loss_mask[17]: expected 0 or 1, got 2`. It is
built for 4k-token responses: element checks run as C-level passes over the lists (set of types,
min/max, a sum for finiteness) and fall back to a Python scan only to name a bad index.

Invariants (all checked by `parse_record`):
- `uid` and `instance_id` are non-empty strings of at most MAX_ID_CHARS characters;
- `prompt_token_ids` is non-empty; token ids are ints in [0, 2**32) (they fit in uint32);
- `len(loss_mask) == len(rollout_log_probs) == len(response_token_ids)`;
- `loss_mask` values are 0 or 1; `rollout_log_probs` are finite, and 0.0 where the mask is 0;
- `len(turn_rewards) == len(turn_eval_results)` (one entry per turn; a turn that was not
  evaluated, e.g. no candidate could be extracted, has a reward and a null eval result);
- `reward`, `turn_rewards` and `created_at` are finite; `status` is one of STATUSES;
- `metadata` and each non-null `turn_eval_results[i]` are JSON objects holding only JSON values
  (finite numbers, integers within 64 bits, valid Unicode), nested at most MAX_JSON_DEPTH deep.
bool is never accepted where an int or a float is expected.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from krl_common.validation import ValidationError, type_name
from krl_common.validation import check_type as _check_type

__all__ = [
    "MAX_ID_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_TOKEN_ID",
    "STATUSES",
    "STATUS_ABORTED",
    "STATUS_COMPLETED",
    "STATUS_TRUNCATED",
    "TrajectoryRecord",
    "ValidationError",
    "parse_record",
]

STATUS_COMPLETED = "completed"  # the episode ended normally (solved, or max_turns reached)
STATUS_TRUNCATED = "truncated"  # a generation hit the token limit (slime: Sample.Status.TRUNCATED)
STATUS_ABORTED = "aborted"  # generation was aborted (weight update, shutdown); see slime's ABORTED
STATUSES: tuple[str, ...] = (STATUS_COMPLETED, STATUS_TRUNCATED, STATUS_ABORTED)

MAX_ID_CHARS = 256
MAX_TOKEN_ID = 2**32 - 1  # token ids fit in uint32 (vocabularies are ~150k)
MAX_POLICY_VERSION = 2**62
MAX_SAMPLE_INDEX = 2**31 - 1
MAX_JSON_DEPTH = 32
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # integers every JSON library here round-trips


@dataclass
class TrajectoryRecord:
    """One trajectory (or, in per-turn credit mode, one turn's sample of a trajectory)."""

    uid: str  # idempotency key: a retried write with the same uid is stored once
    instance_id: str  # GRPO group key: the prompt (problem) this trajectory answers
    policy_version: int  # weights version that sampled the response (the oldest, if it changed mid-episode)
    prompt_token_ids: list[int]  # the first prompt exactly as fed to the model
    response_token_ids: list[int]  # everything after the prompt: model turns and feedback turns
    loss_mask: list[int]  # per response token: 1 = sampled by the model (trained on), 0 = not
    rollout_log_probs: list[float]  # per response token: log-prob at sampling time; 0.0 where mask is 0
    turn_rewards: list[float]  # reward of each turn
    turn_eval_results: list[
        dict[str, Any] | None
    ]  # EvalResult JSON of each turn (opaque here); None: not evaluated
    reward: float  # final reward / discounted return used for training
    status: str  # one of STATUSES
    metadata: dict[str, Any] = field(default_factory=dict)  # free-form JSON object (timings, ...)
    created_at: float = field(default_factory=time.time)  # unix seconds, set by the writer
    sample_index: int = 0  # per-turn credit mode: which sample of the trajectory this is

    @property
    def response_length(self) -> int:
        return len(self.response_token_ids)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict in field order (a shallow copy: nested values are shared)."""
        return {f.name: getattr(self, f.name) for f in _FIELDS}

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> TrajectoryRecord:
        return parse_record(data, path=path)

    def validate(self) -> TrajectoryRecord:
        """Check a record built in Python (not via parse_record); returns the validated record."""
        return parse_record(self.to_json())


_FIELDS = dataclasses.fields(TrajectoryRecord)
FIELD_NAMES: frozenset[str] = frozenset(f.name for f in _FIELDS)
REQUIRED_FIELDS: tuple[str, ...] = tuple(
    f.name for f in _FIELDS if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


# --------------------------------------------------------------------------- parsing


def parse_record(data: Any, *, path: str = "", strict_json: bool = False) -> TrajectoryRecord:
    """Validate a decoded JSON object and build a TrajectoryRecord (raises ValidationError).

    `path` prefixes every message (the HTTP app passes `records[i]`). Integers given for float
    fields are converted to float; nothing else is changed.

    `strict_json=True` tells that `data` was produced by a strict decoder (`fastjson.loads` with
    `fastjson.STRICT_DECODER`), which already guarantees that every value is a JSON value
    (finite numbers, integers within 64 bits, valid Unicode, string keys): the free-form fields
    (`metadata`, `turn_eval_results`) are then only checked for their nesting depth instead of
    value by value (a tenth of the cost on an EvalResult). Typed fields are always checked.
    """
    p = f"{path}." if path else ""
    _check_type(path or "record", data, dict)
    unknown = sorted(set(data) - FIELD_NAMES)
    if unknown:
        raise ValidationError(
            f"{path + ': ' if path else ''}unknown field(s) {unknown}; allowed: {sorted(FIELD_NAMES)}"
        )
    for name in REQUIRED_FIELDS:
        if name not in data:
            raise ValidationError(f"{p}{name}: missing required field")

    uid = _check_id(f"{p}uid", data["uid"])
    instance_id = _check_id(f"{p}instance_id", data["instance_id"])
    policy_version = _check_int(f"{p}policy_version", data["policy_version"], 0, MAX_POLICY_VERSION)

    prompt = _check_token_ids(f"{p}prompt_token_ids", data["prompt_token_ids"])
    if not prompt:
        raise ValidationError(f"{p}prompt_token_ids: must not be empty")
    response = _check_token_ids(f"{p}response_token_ids", data["response_token_ids"])
    n = len(response)
    mask, unsampled = _check_mask(f"{p}loss_mask", data["loss_mask"], n)
    log_probs = _check_log_probs(f"{p}rollout_log_probs", data["rollout_log_probs"], n, mask, unsampled)

    turn_rewards = _check_float_list(f"{p}turn_rewards", data["turn_rewards"])
    turn_results = data["turn_eval_results"]
    _check_type(f"{p}turn_eval_results", turn_results, list)
    for i, item in enumerate(turn_results):
        if item is not None:
            _check_type(f"{p}turn_eval_results[{i}]", item, dict)
            _check_free_form(f"{p}turn_eval_results[{i}]", item, strict_json)
    if len(turn_results) != len(turn_rewards):
        raise ValidationError(
            f"{p}turn_eval_results: length {len(turn_results)} != len(turn_rewards) {len(turn_rewards)} "
            "(one entry per turn, null for a turn that was not evaluated)"
        )
    reward = _check_float(f"{p}reward", data["reward"])
    status = data["status"]
    _check_type(f"{p}status", status, str)
    if status not in STATUSES:
        raise ValidationError(f"{p}status: {status!r} is not one of {list(STATUSES)}")

    kwargs: dict[str, Any] = {}
    if "metadata" in data:
        _check_type(f"{p}metadata", data["metadata"], dict)
        _check_free_form(f"{p}metadata", data["metadata"], strict_json)
        kwargs["metadata"] = data["metadata"]
    if "created_at" in data:
        created_at = _check_float(f"{p}created_at", data["created_at"])
        if created_at < 0:
            raise ValidationError(f"{p}created_at: must be >= 0 (unix seconds)")
        kwargs["created_at"] = created_at
    if "sample_index" in data:
        kwargs["sample_index"] = _check_int(f"{p}sample_index", data["sample_index"], 0, MAX_SAMPLE_INDEX)

    return TrajectoryRecord(
        uid=uid,
        instance_id=instance_id,
        policy_version=policy_version,
        prompt_token_ids=prompt,
        response_token_ids=response,
        loss_mask=mask,
        rollout_log_probs=log_probs,
        turn_rewards=turn_rewards,
        turn_eval_results=turn_results,
        reward=reward,
        status=status,
        **kwargs,
    )


# --------------------------------------------------------------------------- field checks


def _check_str(path: str, value: Any) -> str:
    _check_type(path, value, str)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(f"{path}: not valid Unicode (lone surrogate)") from None
    return value


def _check_id(path: str, value: Any) -> str:
    _check_str(path, value)
    if not value.strip():
        raise ValidationError(f"{path}: must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise ValidationError(f"{path}: longer than {MAX_ID_CHARS} characters")
    return value


def _check_int(path: str, value: Any, lo: int, hi: int) -> int:
    _check_type(path, value, int)
    if not lo <= value <= hi:
        raise ValidationError(f"{path}: {value} is out of range [{lo}, {hi}]")
    return value


def _check_float(path: str, value: Any) -> float:
    _check_type(path, value, (int, float))
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValidationError(f"{path}: number out of range") from None
    if not math.isfinite(value):
        raise ValidationError(f"{path}: must be a finite number, got {value}")
    return value


def _check_float_list(path: str, value: Any) -> list[float]:
    _check_type(path, value, list)
    return [_check_float(f"{path}[{i}]", v) for i, v in enumerate(value)]


def _first_bad_type(path: str, values: list[Any], allowed: tuple[type, ...]) -> ValidationError:
    for i, v in enumerate(values):
        if type(v) not in allowed:
            return ValidationError(f"{path}[{i}]: expected {type_name(allowed)}, got {type(v).__name__}")
    raise AssertionError("no bad element found")  # pragma: no cover


def _check_token_ids(path: str, value: Any) -> list[int]:
    _check_type(path, value, list)
    if not value:
        return value
    if set(map(type, value)) != {int}:  # exact type: excludes bool and int subclasses
        raise _first_bad_type(path, value, (int,))
    try:
        array.array("I", value)  # a C loop that fails on any id outside [0, 2**32): 4x min+max's speed
    except OverflowError:
        i = next(i for i, v in enumerate(value) if not 0 <= v <= MAX_TOKEN_ID)
        raise ValidationError(
            f"{path}[{i}]: token id {value[i]} is out of range [0, {MAX_TOKEN_ID}]"
        ) from None
    return value


_UNSAMPLED = bytes.maketrans(b"\x00\x01", b"\x01\x00")  # mask byte -> 1 where the mask is 0


def _check_mask(path: str, value: Any, n: int) -> tuple[list[int], bytes]:
    """Returns the mask and, for the log-prob check, one byte per token: 1 where the mask is 0."""
    _check_type(path, value, list)
    if len(value) != n:
        raise ValidationError(f"{path}: length {len(value)} != len(response_token_ids) {n}")
    if set(map(type, value)) - {int}:
        raise _first_bad_type(path, value, (int,))
    try:
        packed = bytes(value)  # fails on values outside [0, 255]
    except ValueError:
        packed = b"\xff"
    if packed.translate(None, b"\x00\x01"):
        i = next(i for i, v in enumerate(value) if v not in (0, 1))
        raise ValidationError(f"{path}[{i}]: expected 0 or 1, got {value[i]}")
    return value, packed.translate(_UNSAMPLED)


def _check_log_probs(path: str, value: Any, n: int, mask: list[int], unsampled: bytes) -> list[float]:
    _check_type(path, value, list)
    if len(value) != n:
        raise ValidationError(f"{path}: length {len(value)} != len(response_token_ids) {n}")
    if not value:
        return value
    types = set(map(type, value))
    if not types <= {float, int}:
        raise _first_bad_type(path, value, (float, int))
    if int in types:  # e.g. 0 for an unsampled token
        value = [_check_float(f"{path}[{i}]", v) for i, v in enumerate(value)]
    # Any NaN or inf makes the sum non-finite; a non-finite sum of finite values (overflow) is
    # told apart by the scan, which finds no bad element then.
    if not math.isfinite(sum(value)):
        for i, v in enumerate(value):
            if not math.isfinite(v):
                raise ValidationError(f"{path}[{i}]: must be a finite number, got {v}")
    # Where loss_mask is 0 (tokens the model did not sample) the log-prob must be 0.0.
    if any(itertools.compress(value, unsampled)):
        i = next(i for i, (m, v) in enumerate(zip(mask, value, strict=True)) if m == 0 and v != 0.0)
        raise ValidationError(f"{path}[{i}]: must be 0.0 where loss_mask is 0, got {value[i]}")
    return value


def _check_free_form(path: str, value: dict[str, Any], strict_json: bool) -> None:
    if not strict_json:
        _check_json_value(path, value, 1)
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValidationError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
        for item in container.values() if type(container) is dict else container:
            if type(item) is dict or type(item) is list:
                stack.append((item, depth + 1))


def _check_json_value(path: str, value: Any, depth: int) -> None:
    """Free-form JSON (metadata, eval results): JSON types only, finite, bounded depth."""
    if depth > MAX_JSON_DEPTH:
        raise ValidationError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"{path}: object key {key!r} is not a string")
            _check_str(f"{path}.{key}", key)
            _check_json_value(f"{path}.{key}", item, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_value(f"{path}[{i}]", item, depth + 1)
    elif isinstance(value, str):
        _check_str(path, value)
    elif value is None or isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _UINT64_MAX:
            raise ValidationError(f"{path}: integer {value} does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(f"{path}: must be a finite number, got {value}")
    else:
        raise ValidationError(f"{path}: {type(value).__name__} is not a JSON value")
