"""Evaluation metrics over per-sample results (`results.py`), per level and per turn.

Definitions (docs/EVAL_REPORTS.md has the worked examples):
- A sample's outcome "at turn t" is its best turn among its first t turns: the correct turn with
  the highest speedup if any turn is correct (a timed correct turn beats an untimed one), else
  its latest turn. An episode that stopped early (or ended) before turn t keeps its final
  outcome. This is "best of the first t turns", what a multi-turn user gets after t attempts.
- fast_p (KernelBench): the share of samples that are correct AND have speedup > p. fast_0 is
  the correct rate (speedup not needed); for p > 0 an untimed correct sample (CPU evaluation)
  does not count, and `untimed_correct` says how many there were.
- Per problem, then per level: every rate is a mean over problems of the per-problem mean over
  its samples, so each problem weighs the same whatever its sample count.
- pass@k: the unbiased estimator of the Codex paper, 1 - C(n-c, k) / C(n, k) per problem with n
  samples of which c are correct, averaged over problems; reported for k <= the smallest n.
- Geometric-mean speedup: over the samples that are correct and timed (pooled over problems);
  null when there are none.
- Status breakdown: of the outcomes (per turn) and of the attempts made at each turn index, with
  the turn statuses of `results.py` (`ok`, `compile_error`, `runtime_error`, `incorrect`,
  `rejected`, `timeout`, `crashed`, `no_code`, `eval_refused`, ...). Samples without any turn
  (no room for a first generation) count as `no_response`.
- Per role (generator, fixer, optimizer: slime_ext/rollout/roles.py): over every attempt made in
  that role, its correct rate, the geometric-mean speedup of its correct timed attempts, and
  fast_1 (correct and faster than the reference) over all its attempts.
- Against torch.compile (samples evaluated with `options.baseline_compile`): `fast_p_vs_compile`
  and `geomean_speedup_vs_compile`, the same definitions on `speedup_vs_compile` (a sample's best
  turn is still chosen by its eager speedup); null when no correct outcome has it.
- Aborted samples (not the model's outcome) are left out of every metric and counted apart.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from slime_ext.reports.results import SampleResult, TurnResult

__all__ = [
    "FAST_P_THRESHOLDS",
    "NO_RESPONSE",
    "Outcome",
    "fast_p",
    "geomean",
    "group_summary",
    "outcome_at_turn",
    "pass_at_k",
    "per_problem",
    "summarize",
]

FAST_P_THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
NO_RESPONSE = "no_response"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k), computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    vals = list(values)
    if not vals:
        return None
    if any(v <= 0 for v in vals):
        raise ValueError("geomean needs positive values")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Outcome:
    """A sample's result at some turn: what fast_p, pass@k and the status breakdown count."""

    status: str
    correct: bool
    speedup: float | None  # only for correct turns
    speedup_vs_compile: float | None = None  # only for correct turns timed against torch.compile

    def fast(self, p: float, vs_compile: bool = False) -> bool:
        if not self.correct:
            return False
        if p <= 0:
            return True
        speedup = self.speedup_vs_compile if vs_compile else self.speedup
        return speedup is not None and speedup > p


def _rank(turn: TurnResult) -> tuple[int, int, float]:
    if not turn.correct:
        return (0, 0, 0.0)
    return (1, turn.speedup is not None, turn.speedup or 0.0)


def outcome_at_turn(sample: SampleResult, turns: int | None = None) -> Outcome:
    """The sample's best turn among its first `turns` turns (all turns when None)."""
    seen = sample.turns if turns is None else sample.turns[:turns]
    if not seen:
        return Outcome(NO_RESPONSE, False, None)
    best = max(reversed(seen), key=_rank)  # ties: the latest turn
    if not best.correct:
        best = seen[-1]
    if not best.correct:
        return Outcome(best.status, False, None)
    return Outcome(best.status, True, best.speedup, best.speedup_vs_compile)


def fast_p(outcomes: Sequence[Outcome], p: float, vs_compile: bool = False) -> float:
    """Share of outcomes that are correct with speedup > p (p <= 0: correct); `vs_compile`: the
    speedup against torch.compile."""
    if not outcomes:
        raise ValueError("fast_p of no outcomes")
    return sum(o.fast(p, vs_compile) for o in outcomes) / len(outcomes)


def _by_problem(samples: Iterable[SampleResult]) -> dict[str, list[SampleResult]]:
    groups: dict[str, list[SampleResult]] = defaultdict(list)
    for s in samples:
        groups[s.instance_id].append(s)
    return dict(groups)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _turn_metrics(
    problems: dict[str, list[SampleResult]], turns: int | None, thresholds: Sequence[float]
) -> dict[str, Any]:
    per_problem = {pid: [outcome_at_turn(s, turns) for s in ss] for pid, ss in problems.items()}
    all_outcomes = [o for os_ in per_problem.values() for o in os_]
    speedups = [o.speedup for o in all_outcomes if o.correct and o.speedup is not None]
    vs_compile = [
        o.speedup_vs_compile for o in all_outcomes if o.correct and o.speedup_vs_compile is not None
    ]
    return {
        "correct_rate": _mean([fast_p(os_, 0.0) for os_ in per_problem.values()]),
        "fast_p": {_pkey(p): _mean([fast_p(os_, p) for os_ in per_problem.values()]) for p in thresholds},
        "geomean_speedup": geomean(speedups),
        "fast_p_vs_compile": {
            _pkey(p): _mean([fast_p(os_, p, vs_compile=True) for os_ in per_problem.values()])
            for p in thresholds
        }
        if vs_compile
        else None,
        "geomean_speedup_vs_compile": geomean(vs_compile),
        "timed_correct": len(speedups),
        "untimed_correct": sum(1 for o in all_outcomes if o.correct and o.speedup is None),
        "status": dict(sorted(Counter(o.status for o in all_outcomes).items())),
    }


def _pkey(p: float) -> str:
    return f"{p:g}"


def group_summary(
    samples: Sequence[SampleResult],
    *,
    thresholds: Sequence[float] = FAST_P_THRESHOLDS,
    ks: Sequence[int] | None = None,
    max_turns: int | None = None,
) -> dict[str, Any]:
    """Metrics of one group of samples (a level, or everything); aborted samples left out.

    `max_turns` sets how many turn columns to report (default: the most turns any sample took);
    `ks` the pass@k values (default 1 and the smallest per-problem sample count).
    """
    scored = [s for s in samples if not s.aborted]
    problems = _by_problem(scored)
    n_turns = max_turns if max_turns is not None else max((len(s.turns) for s in scored), default=0)
    counts = [len(ss) for ss in problems.values()]
    summary: dict[str, Any] = {
        "problems": len(problems),
        "samples": len(scored),
        "aborted": len(samples) - len(scored),
        "samples_per_problem": {"min": min(counts, default=0), "max": max(counts, default=0)},
    }
    if not problems:
        return summary
    summary["final"] = _turn_metrics(problems, None, thresholds)
    summary["per_turn"] = [
        {"turn": t, **_turn_metrics(problems, t, thresholds)} for t in range(1, n_turns + 1)
    ]
    attempts: list[dict[str, int]] = []
    for t in range(n_turns):
        attempts.append(dict(sorted(Counter(s.turns[t].status for s in scored if len(s.turns) > t).items())))
    summary["attempt_status_per_turn"] = attempts
    summary["per_role"] = role_summary(scored)
    n_min = min(counts)
    wanted = sorted(set(ks if ks is not None else (1, n_min)))
    pass_k: dict[str, float] = {}
    for k in wanted:
        if 1 <= k <= n_min:
            values = [
                pass_at_k(len(ss), sum(outcome_at_turn(s).correct for s in ss), k) for ss in problems.values()
            ]
            pass_k[str(k)] = sum(values) / len(values)
    summary["pass_at_k"] = pass_k
    return summary


def role_summary(samples: Sequence[SampleResult]) -> dict[str, dict[str, Any]]:
    """Per role (slime_ext/rollout/roles.py), over every attempt made in that role: attempts,
    correct rate, the geometric-mean speedup of its correct timed attempts and the share of them
    faster than the reference. Attempts of results written before roles are left out."""
    by_role: dict[str, list[TurnResult]] = defaultdict(list)
    for s in samples:
        for t in s.turns:
            if t.role is not None:
                by_role[t.role].append(t)
    out: dict[str, dict[str, Any]] = {}
    for role, turns in sorted(by_role.items()):
        timed = [t.speedup for t in turns if t.correct and t.speedup is not None]
        out[role] = {
            "attempts": len(turns),
            "correct_rate": sum(t.correct for t in turns) / len(turns),
            "geomean_speedup": geomean(timed),
            "fast_1": sum(x > 1.0 for x in timed) / len(turns),
        }
    return out


def summarize(
    samples: Sequence[SampleResult],
    *,
    thresholds: Sequence[float] = FAST_P_THRESHOLDS,
    ks: Sequence[int] | None = None,
    max_turns: int | None = None,
) -> dict[str, Any]:
    """`group_summary` per level (keys "1", "2", ...) and over everything ("all")."""
    levels: dict[int, list[SampleResult]] = defaultdict(list)
    for s in samples:
        levels[s.level].append(s)
    kw = {"thresholds": thresholds, "ks": ks, "max_turns": max_turns}
    out = {str(level): group_summary(levels[level], **kw) for level in sorted(levels)}
    out["all"] = group_summary(list(samples), **kw)
    return out


def per_problem(samples: Sequence[SampleResult]) -> list[dict[str, Any]]:
    """One row per problem (final outcomes, aborted samples left out): samples, correct rate,
    fast_1, the best speedup of a correct sample, and the outcome statuses."""
    rows = []
    for iid, ss in sorted(_by_problem(s for s in samples if not s.aborted).items()):
        outs = [outcome_at_turn(s) for s in ss]
        speedups = [o.speedup for o in outs if o.correct and o.speedup is not None]
        rows.append(
            {
                "instance_id": iid,
                "problem_id": ss[0].problem_id,
                "level": ss[0].level,
                "samples": len(ss),
                "correct_rate": fast_p(outs, 0.0),
                "fast_1": fast_p(outs, 1.0),
                "best_speedup": max(speedups, default=None),
                "status": dict(sorted(Counter(o.status for o in outs).items())),
            }
        )
    return rows
