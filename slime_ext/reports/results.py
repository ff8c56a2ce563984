"""The per-sample evaluation result: one jsonl line per finished (problem, sample index).

This is the one definition of that record. `tools/eval_model` appends a line (flushed and
fsynced) as soon as a sample's episode ends, so an interrupted run loses at most the samples in
flight; re-running skips the (instance_id, sample) pairs already in the file. The metrics, the
report and `tools/compare_runs` read only this file.

Record fields (`SampleResult`, format version `v` = 1):
- `instance_id`, `problem_id`, `level`, `name`, `split`, `problem_hash`: copied from the prompt
  record (`slime_ext/rollout/problems.py`), so a results file is self-describing.
- `sample` (int >= 0): the sample index within the problem (0 .. k-1).
- `model` (str): the label of the evaluated model; `config_id` (str): fingerprint of every
  setting that changes outcomes (backend, model, turns, sampling, eval options, prompts); one file
  holds one configuration.
- `status`: the episode status (`completed`, `truncated`, `aborted`); `abort_reason`.
  Aborted samples (eval server outage, engine abort, evaluator-side failure) are not the model's
  outcome: metrics leave them out and a re-run evaluates them again (the newer line wins).
- `early_stopped` (bool), `timing` (seconds: `total_s`, `generate_s`, `eval_s`),
  `finished_at` (unix time).
- `turns`: one `TurnResult` per generated turn: `turn` (0-based), `status` (the eval status, with
  `rejected` whenever a reject-severity check fired; or `no_code` when the response had no fenced
  python block, `eval_refused` when the eval server refused the request, `not_evaluated` when the
  evaluation failed), `compiled`, `correct` (status `ok` and correct), `speedup` (null without
  timing), `checks` (ids of the checks that fired), `finish_reason`, `reward`, `gen_s`,
  `eval_s`, `candidate` (the extracted source or null), `error` (short error text or null).
- `chat` (list of `{"role", "content"}` or null): the conversation, when the run keeps it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eval_server.schema import STATUS_OK, STATUS_REJECTED, STATUSES, EvalResult
from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.rollout.episode import EPISODE_STATUSES
from slime_ext.rollout.problems import PromptRecord
from slime_ext.rollout.rewards import is_rejected
from slime_ext.rollout.roles import ROLES
from slime_ext.trajectory.record import STATUS_ABORTED

__all__ = [
    "FORMAT_VERSION",
    "TURN_NO_CODE",
    "TURN_NOT_EVALUATED",
    "TURN_REFUSED",
    "TURN_STATUSES",
    "ResultsFile",
    "SampleResult",
    "TurnResult",
    "latest_results",
    "load_results",
    "parse_sample_result",
    "sample_result_from_episode",
]

FORMAT_VERSION = 1
TURN_NO_CODE = "no_code"
TURN_REFUSED = "eval_refused"
TURN_NOT_EVALUATED = "not_evaluated"
TURN_STATUSES: tuple[str, ...] = (*STATUSES, TURN_NO_CODE, TURN_REFUSED, TURN_NOT_EVALUATED)

_ERROR_CHARS = 500


@dataclass(frozen=True)
class TurnResult:
    turn: int
    status: str
    compiled: bool = False
    correct: bool = False
    speedup: float | None = None
    checks: tuple[str, ...] = ()
    finish_reason: str = ""
    reward: float = 0.0
    gen_s: float = 0.0
    eval_s: float = 0.0
    candidate: str | None = None
    error: str | None = None
    role: str | None = None  # slime_ext/rollout/roles.py; None in results written before roles
    speedup_vs_compile: float | None = None  # against torch.compile, when the evaluation timed it

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "role": self.role,
            "status": self.status,
            "compiled": self.compiled,
            "correct": self.correct,
            "speedup": self.speedup,
            "speedup_vs_compile": self.speedup_vs_compile,
            "checks": list(self.checks),
            "finish_reason": self.finish_reason,
            "reward": self.reward,
            "gen_s": self.gen_s,
            "eval_s": self.eval_s,
            "candidate": self.candidate,
            "error": self.error,
        }


@dataclass(frozen=True)
class SampleResult:
    instance_id: str
    problem_id: str
    level: int
    name: str
    split: str
    problem_hash: str
    sample: int
    model: str
    config_id: str
    status: str
    turns: tuple[TurnResult, ...] = ()
    abort_reason: str | None = None
    early_stopped: bool = False
    timing: dict[str, float] = field(default_factory=dict)
    finished_at: float = 0.0
    chat: tuple[dict[str, str], ...] | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.instance_id, self.sample)

    @property
    def aborted(self) -> bool:
        return self.status == STATUS_ABORTED

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "instance_id": self.instance_id,
            "problem_id": self.problem_id,
            "level": self.level,
            "name": self.name,
            "split": self.split,
            "problem_hash": self.problem_hash,
            "sample": self.sample,
            "model": self.model,
            "config_id": self.config_id,
            "status": self.status,
            "abort_reason": self.abort_reason,
            "early_stopped": self.early_stopped,
            "turns": [t.to_json() for t in self.turns],
            "timing": dict(self.timing),
            "finished_at": self.finished_at,
            "chat": None if self.chat is None else [dict(m) for m in self.chat],
        }


# ---------------------------------------------------------------------------- from an episode


class _TurnLike(Protocol):
    index: int
    finish_reason: str
    candidate: str | None
    eval_result: dict[str, Any] | None
    eval_error: str | None
    reward: float
    gen_s: float
    eval_s: float
    role: str


class EpisodeLike(Protocol):
    """What both policy backends return: `slime_ext.rollout.episode.Episode` and the chat loop's episode."""

    turns: Sequence[_TurnLike]
    status: str
    abort_reason: str | None
    early_stopped: bool
    timing: dict[str, float]
    messages: list[dict[str, str]]


def _short(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + " ..."


def turn_result(turn: _TurnLike) -> TurnResult:
    """Summarise one episode turn: the status a report counts, correctness, speedup, checks."""
    common = {
        "turn": turn.index,
        "finish_reason": turn.finish_reason,
        "reward": float(turn.reward),
        "gen_s": float(turn.gen_s),
        "eval_s": float(turn.eval_s),
        "candidate": turn.candidate,
        "role": turn.role,
    }
    if turn.eval_result is None:
        if turn.candidate is None:
            return TurnResult(status=TURN_NO_CODE, **common)
        if turn.eval_error is not None:
            return TurnResult(status=TURN_REFUSED, error=_short(turn.eval_error), **common)
        return TurnResult(status=TURN_NOT_EVALUATED, **common)
    result = EvalResult.from_json(turn.eval_result)
    status = STATUS_REJECTED if is_rejected(result) else result.status
    error = None
    if result.error:
        error = _short(f"{result.error.get('type', '')}: {result.error.get('message', '')}".strip(": "))
    return TurnResult(
        status=status,
        compiled=bool(result.compiled),
        correct=status == STATUS_OK and bool(result.correct),
        speedup=result.speedup,
        speedup_vs_compile=result.speedup_vs_compile,
        checks=tuple(c.id for c in result.checks),
        error=error,
        **common,
    )


def sample_result_from_episode(
    record: PromptRecord,
    sample: int,
    episode: EpisodeLike,
    *,
    model: str,
    config_id: str,
    keep_chat: bool = False,
) -> SampleResult:
    """The result line of one finished episode on `record`."""
    return SampleResult(
        instance_id=record.instance_id,
        problem_id=record.problem_id,
        level=record.level,
        name=record.name,
        split=record.split,
        problem_hash=record.problem_hash,
        sample=sample,
        model=model,
        config_id=config_id,
        status=episode.status,
        turns=tuple(turn_result(t) for t in episode.turns),
        abort_reason=episode.abort_reason,
        early_stopped=bool(episode.early_stopped),
        timing={k: float(v) for k, v in episode.timing.items()},
        finished_at=time.time(),
        chat=tuple(dict(m) for m in episode.messages) if keep_chat else None,
    )


# ---------------------------------------------------------------------------- parsing

_TURN_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    # name: (type, nullable)
    "turn": (int, False),
    "status": (str, False),
    "compiled": (bool, False),
    "correct": (bool, False),
    "speedup": ((int, float), True),
    "checks": (list, False),
    "finish_reason": (str, False),
    "reward": ((int, float), False),
    "gen_s": ((int, float), False),
    "eval_s": ((int, float), False),
    "candidate": (str, True),
    "error": (str, True),
}

_SAMPLE_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "v": (int, False),
    "instance_id": (str, False),
    "problem_id": (str, False),
    "level": (int, False),
    "name": (str, False),
    "split": (str, False),
    "problem_hash": (str, False),
    "sample": (int, False),
    "model": (str, False),
    "config_id": (str, False),
    "status": (str, False),
    "abort_reason": (str, True),
    "early_stopped": (bool, False),
    "turns": (list, False),
    "timing": (dict, False),
    "finished_at": ((int, float), False),
    "chat": (list, True),
}


def _check_fields(path: str, data: Any, spec: Mapping[str, tuple[type | tuple[type, ...], bool]]) -> None:
    check_type(path, data, dict)
    reject_unknown(path, data, set(spec))
    for name, (expected, nullable) in spec.items():
        if name not in data:
            raise ValidationError(f"{path}.{name}: missing required field")
        value = data[name]
        if value is None and nullable:
            continue
        check_type(f"{path}.{name}", value, expected)


def _parse_turn(data: Any, path: str) -> TurnResult:
    check_type(path, data, dict)
    data = dict(data)
    role = data.pop("role", None)  # optional: results written before roles have none
    vs_compile = data.pop("speedup_vs_compile", None)  # optional: results written before it
    if vs_compile is not None:
        check_type(f"{path}.speedup_vs_compile", vs_compile, (int, float))
    if role is not None and role not in ROLES:
        raise ValidationError(f"{path}.role: unknown role {role!r}; known: {list(ROLES)}")
    _check_fields(path, data, _TURN_FIELDS)
    if data["status"] not in TURN_STATUSES:
        raise ValidationError(
            f"{path}.status: unknown status {data['status']!r}; known: {list(TURN_STATUSES)}"
        )
    for i, c in enumerate(data["checks"]):
        check_type(f"{path}.checks[{i}]", c, str)
    if data["correct"] and data["status"] != STATUS_OK:
        raise ValidationError(f"{path}.correct: true with status {data['status']!r} (only 'ok' is correct)")
    speedup = data["speedup"]
    return TurnResult(
        turn=data["turn"],
        status=data["status"],
        compiled=data["compiled"],
        correct=data["correct"],
        speedup=None if speedup is None else float(speedup),
        checks=tuple(data["checks"]),
        finish_reason=data["finish_reason"],
        reward=float(data["reward"]),
        gen_s=float(data["gen_s"]),
        eval_s=float(data["eval_s"]),
        candidate=data["candidate"],
        error=data["error"],
        role=role,
        speedup_vs_compile=None if vs_compile is None else float(vs_compile),
    )


def parse_sample_result(data: Any, path: str = "result") -> SampleResult:
    """Validate one decoded JSON line; ValidationError names the bad field."""
    _check_fields(path, data, _SAMPLE_FIELDS)
    if data["v"] != FORMAT_VERSION:
        raise ValidationError(
            f"{path}.v: unsupported format version {data['v']} (this code reads {FORMAT_VERSION})"
        )
    if data["status"] not in EPISODE_STATUSES:
        raise ValidationError(
            f"{path}.status: expected one of {list(EPISODE_STATUSES)}, got {data['status']!r}"
        )
    if data["level"] < 1 or data["sample"] < 0:
        raise ValidationError(f"{path}: level must be >= 1 and sample >= 0")
    turns = tuple(_parse_turn(t, f"{path}.turns[{i}]") for i, t in enumerate(data["turns"]))
    if [t.turn for t in turns] != list(range(len(turns))):
        raise ValidationError(f"{path}.turns: turn indices must be 0, 1, 2, ... in order")
    for k, v in data["timing"].items():
        check_type(f"{path}.timing.{k}", v, (int, float))
    chat = None
    if data["chat"] is not None:
        for i, m in enumerate(data["chat"]):
            check_type(f"{path}.chat[{i}]", m, dict)
        chat = tuple(dict(m) for m in data["chat"])
    return SampleResult(
        instance_id=data["instance_id"],
        problem_id=data["problem_id"],
        level=data["level"],
        name=data["name"],
        split=data["split"],
        problem_hash=data["problem_hash"],
        sample=data["sample"],
        model=data["model"],
        config_id=data["config_id"],
        status=data["status"],
        turns=turns,
        abort_reason=data["abort_reason"],
        early_stopped=data["early_stopped"],
        timing={k: float(v) for k, v in data["timing"].items()},
        finished_at=float(data["finished_at"]),
        chat=chat,
    )


# ---------------------------------------------------------------------------- the file


def _read_lines(path: Path) -> tuple[list[SampleResult], int]:
    """Records of a results file and the byte length of its complete part. A last line without
    a newline is what an interrupted write leaves: it is ignored (and reported by the length)."""
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    records = []
    for lineno, line in enumerate(data[:complete].splitlines(), 1):
        if not line.strip():
            continue
        try:
            decoded = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        try:
            records.append(parse_sample_result(decoded))
        except ValidationError as exc:
            raise ValidationError(f"{path}:{lineno}: {exc}") from None
    return records, complete


def load_results(path: str | os.PathLike[str]) -> list[SampleResult]:
    """Every complete record of a results file, in file order (an unfinished last line is skipped)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"results file not found: {p}")
    return _read_lines(p)[0]


def latest_results(records: Iterable[SampleResult]) -> list[SampleResult]:
    """One record per (instance_id, sample): the last one written (a re-run of an aborted sample
    appends a newer line). Ordered by instance_id, then sample."""
    latest: dict[tuple[str, int], SampleResult] = {}
    for r in records:
        latest[r.key] = r
    return [latest[k] for k in sorted(latest)]


class ResultsFile:
    """Append-only results jsonl of one run configuration, resumable.

    Opening an existing file validates every line, cuts off an unfinished last line (left by a
    killed run), and refuses a file written with another `config_id`, so one file never mixes
    configurations.
    """

    def __init__(self, path: str | os.PathLike[str], config_id: str) -> None:
        self.path = Path(path)
        self.config_id = config_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[SampleResult] = []
        self.dropped_partial_line = False
        if self.path.exists():
            self.records, complete = _read_lines(self.path)
            if complete < self.path.stat().st_size:
                with self.path.open("r+b") as f:
                    f.truncate(complete)
                    f.flush()
                    os.fsync(f.fileno())
                self.dropped_partial_line = True
            other = sorted({r.config_id for r in self.records} - {config_id})
            if other:
                raise ValidationError(
                    f"{self.path}: written with other settings (config_id {', '.join(other)}; this run "
                    f"is {config_id}); use another output directory, or the same settings to resume"
                )

    def done(self) -> set[tuple[str, int]]:
        """(instance_id, sample) pairs whose latest record is final (not aborted)."""
        return {r.key for r in latest_results(self.records) if not r.aborted}

    def append(self, record: SampleResult) -> None:
        """Write one line and make it durable before returning."""
        if record.config_id != self.config_id:
            raise ValueError(f"record config_id {record.config_id} != file's {self.config_id}")
        line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)
