"""Reference timings a worker keeps in its own memory, so the reference is timed once per problem
and worker instead of in every evaluation.

The reference's timing is what a speedup divides, so it is trusted only from a process no
candidate can reach: a judge measures it in a runner no candidate has been loaded into (its
first evaluation of the problem), hands it to its worker with its result, and the worker (which
never runs candidate code) gives it to the judges of the problem's later evaluations. Those skip
the reference entirely (its load, warm-up and windows: 0.58-0.63 s of exclusive GPU time per
evaluation on an H200) and measure only the protocol's hand-over in their own pair.

An entry is believed while it is younger than the server's `reference_max_age_s` and the GPU's
clock (the delay kernel's cycles per ms, which every judge measures) is within CLOCK_DRIFT of the
clock it was timed at; otherwise the evaluation times the reference again before the candidate
is loaded. Nothing here imports torch: the worker's parent uses the store.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from eval_server import wire
from eval_server.schema import TimingStats, build_dataclass

# the SM clock may move this much (relative) between the reference's timing and a later use
CLOCK_DRIFT = 0.02
REMEMBERED_PROBLEMS = 1024  # a worker's store: the problems it evaluated last
KEYS_PER_PROBLEM = 4  # settings (timing trials, seeds) a problem is evaluated under at once


@dataclass(frozen=True)
class KnownReference:
    """One problem's reference timing under one cache key, as a judge measured it."""

    key: str  # eval_server.pipeline.ref_cache.cache_key of judge.evaluate.reference_cache_key
    stats: TimingStats
    pre_ms: float  # the judge's own steps around its windows (escaped-work baseline)
    post_ms: float
    cycles_per_ms: float  # the GPU's clock when it was timed
    measured_at: float  # CLOCK_MONOTONIC (system-wide), seconds
    # the judge's precision facts of the problem (judge/precision.py): None not recorded, {} none
    # (no floating output, or an op without a float64 kernel)
    precision: dict[str, Any] | None = None
    # the reference through torch.compile (options.baseline_compile), timed by a judge of this
    # worker before any candidate code, while this entry was fresh: stale with it
    compiled: TimingStats | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "stats": dataclasses.asdict(self.stats),
            "pre_ms": self.pre_ms,
            "post_ms": self.post_ms,
            "cycles_per_ms": self.cycles_per_ms,
            "measured_at": self.measured_at,
            "precision": self.precision,
            "compiled": dataclasses.asdict(self.compiled) if self.compiled is not None else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> KnownReference:
        """Raises ValueError on anything but a complete entry of finite numbers."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            raise ValueError("a known reference needs a key")
        numbers = [data.get(k) for k in ("pre_ms", "post_ms", "cycles_per_ms", "measured_at")]
        if not all(isinstance(v, (int, float)) and wire.finite(v) for v in numbers) or not numbers[2] > 0:
            raise ValueError("a known reference's numbers must be finite (its clock > 0)")
        stats = _stats(data.get("stats"))
        compiled = _stats(data["compiled"]) if data.get("compiled") is not None else None
        precision = _precision(data.get("precision"))
        return cls(data["key"], stats, *(float(v) for v in numbers), precision=precision, compiled=compiled)

    def stale(self, now: float, max_age_s: float, cycles_per_ms: float) -> str | None:
        """Why this entry may not be used now, or None."""
        age = now - self.measured_at
        if not 0 <= age <= max_age_s:
            return f"timed {age:.0f} s ago, more than {max_age_s:g} s"
        drift = abs(cycles_per_ms / self.cycles_per_ms - 1)
        if not drift <= CLOCK_DRIFT:
            return f"the GPU's clock moved {drift:.1%} since"
        return None


@dataclass
class Handoff:
    """Between a worker and one judge: the entries the worker knows for the problem (JSON, as they
    crossed the pipe), and the entry the judge measured, if it timed the reference."""

    given: list[Any] = field(default_factory=list)
    learned: KnownReference | None = None


PRECISION_FIELDS = ("ref_error", "budget", "ref_scale")


def _precision(data: Any) -> dict[str, Any] | None:
    """Precision facts as a judge recorded them: None, {} or finite non-negative numbers and a dtype."""
    if data is None or data == {}:
        return data
    if not isinstance(data, dict) or set(data) != {*PRECISION_FIELDS, "dtype"} or not isinstance(data["dtype"], str):
        raise ValueError("a known reference's precision facts are malformed")
    if not all(isinstance(data[k], (int, float)) and wire.finite(data[k]) and data[k] >= 0 for k in PRECISION_FIELDS):
        raise ValueError("a known reference's precision facts must be finite and >= 0")
    return {**{k: float(data[k]) for k in PRECISION_FIELDS}, "dtype": data["dtype"]}


def _stats(data: Any) -> TimingStats:
    stats = build_dataclass(TimingStats, "known.stats", data)  # a dict of its fields only
    numbers = (stats.median_ms, stats.min_ms, stats.mean_ms)
    if not all(isinstance(v, (int, float)) and wire.finite(v) and v > 0 for v in numbers):
        raise ValueError("a known reference's timing must be resolved (finite times > 0)")
    if (
        type(stats.calls_per_trial) is not int
        or stats.calls_per_trial < 1
        or not isinstance(stats.method, str)
    ):
        raise ValueError("a known reference's timing needs its method and calls per window")
    return stats


def find(entries: Any, key: str) -> KnownReference | None:
    """The entry under `key` among what the worker sent (malformed ones are skipped)."""
    for data in entries if isinstance(entries, list) else []:
        try:
            entry = KnownReference.from_json(data)
        except (ValueError, TypeError, KeyError):
            continue
        if entry.key == key:
            return entry
    return None


class KnownStore:
    """The worker's entries per problem hash, the least recently used problems forgotten."""

    def __init__(self, problems: int = REMEMBERED_PROBLEMS) -> None:
        self.problems = problems
        self._by_problem: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()

    def entries(self, problem: str) -> list[dict[str, Any]]:
        """What the judge of an evaluation of `problem` is given."""
        found = self._by_problem.get(problem)
        if found is None:
            return []
        self._by_problem.move_to_end(problem)
        return list(found.values())

    def learn(self, problem: str, data: Any) -> bool:
        """Keep what a judge measured (the newest entry per key); False if it is malformed."""
        try:
            entry = KnownReference.from_json(data)
        except (ValueError, TypeError, KeyError):
            return False
        keys = self._by_problem.setdefault(problem, {})
        keys.pop(entry.key, None)
        keys[entry.key] = entry.to_json()
        while len(keys) > KEYS_PER_PROBLEM:
            del keys[next(iter(keys))]
        self._by_problem.move_to_end(problem)
        while len(self._by_problem) > self.problems:
            self._by_problem.popitem(last=False)
        return True

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_problem.values())
