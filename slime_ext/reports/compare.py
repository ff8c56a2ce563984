"""Compare two evaluation runs problem by problem, with paired bootstrap confidence intervals.

Two runs (results files of `tools/eval_model`) are paired on the problems both evaluated (same
`instance_id`, and the same `problem_hash`: otherwise the files describe different problems and
the comparison is refused). Per problem and run, every metric is the mean over that problem's
samples of the sample's outcome (`metrics.outcome_at_turn`, best of all turns unless a turn is
given):
- `correct`: correct (fast_0);
- `fast_<p>`: correct with speedup > p;
- `mean_speedup`: the speedup when correct, 0 when not (KernelBench-style average over all
  problems); undefined for a problem with an untimed correct sample (CPU runs), which is then
  left out of that metric.

The difference B - A is the mean over paired problems of the per-problem differences; its
confidence interval is the percentile interval of that mean over bootstrap resamples of the
problems (with replacement, seeded: the same seed gives the same interval). `p_b_better` is the
share of resamples where B's mean is above A's (ties count half).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from krl_common.validation import ValidationError
from slime_ext.reports.metrics import Outcome, outcome_at_turn
from slime_ext.reports.report import markdown_table
from slime_ext.reports.results import SampleResult, latest_results

__all__ = [
    "BootstrapCI",
    "Comparison",
    "MetricDiff",
    "compare_runs",
    "paired_bootstrap",
    "per_problem_values",
    "render_comparison",
]


@dataclass(frozen=True)
class BootstrapCI:
    mean_a: float
    mean_b: float
    diff: float
    low: float
    high: float
    p_b_better: float
    n: int


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Percentile CI of mean(b - a) by resampling the pairs with replacement."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired_bootstrap needs two equally long non-empty sequences, got {len(a)} and {len(b)}"
        )
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("resamples must be >= 1 and confidence in (0, 1)")
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diffs = vb - va
    n = len(diffs)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // n)  # bound the index matrix (~16 MB)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diffs[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    better = float(np.mean(means > 0) + 0.5 * np.mean(means == 0))
    return BootstrapCI(
        mean_a=float(va.mean()),
        mean_b=float(vb.mean()),
        diff=float(diffs.mean()),
        low=float(low),
        high=float(high),
        p_b_better=better,
        n=n,
    )


def _metric_value(outcomes: Sequence[Outcome], metric: str) -> float | None:
    if metric == "correct":
        return sum(o.correct for o in outcomes) / len(outcomes)
    if metric.startswith("fast_"):
        p = float(metric[len("fast_") :])
        return sum(o.fast(p) for o in outcomes) / len(outcomes)
    if metric == "mean_speedup":
        if any(o.correct and o.speedup is None for o in outcomes):
            return None
        return sum(o.speedup if o.correct and o.speedup is not None else 0.0 for o in outcomes) / len(
            outcomes
        )
    raise ValueError(f"unknown metric {metric!r} (correct, fast_<p>, mean_speedup)")


def per_problem_values(
    samples: Sequence[SampleResult], metrics: Sequence[str], turn: int | None = None
) -> dict[str, dict[str, float | None]]:
    """instance_id -> metric -> the per-problem value (aborted samples left out)."""
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for s in latest_results(samples):
        if not s.aborted:
            groups[s.instance_id].append(outcome_at_turn(s, turn))
    return {pid: {m: _metric_value(os_, m) for m in metrics} for pid, os_ in groups.items()}


@dataclass(frozen=True)
class MetricDiff:
    level: str  # "1", "2", ... or "all"
    metric: str
    ci: BootstrapCI | None  # None when no paired problem has the metric


@dataclass
class Comparison:
    label_a: str
    label_b: str
    paired: list[str]
    only_a: list[str]
    only_b: list[str]
    metrics: list[str]
    rows: list[MetricDiff]
    problems: list[tuple[str, int, dict[str, float | None], dict[str, float | None]]] = field(
        default_factory=list
    )
    resamples: int = 10_000
    confidence: float = 0.95
    seed: int = 0
    turn: int | None = None


def _problem_info(samples: Sequence[SampleResult]) -> dict[str, tuple[int, str]]:
    return {s.instance_id: (s.level, s.problem_hash) for s in samples}


def compare_runs(
    a: Sequence[SampleResult],
    b: Sequence[SampleResult],
    *,
    label_a: str = "A",
    label_b: str = "B",
    fast_ps: Sequence[float] = (1.0,),
    turn: int | None = None,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """Paired comparison of two runs, per level and overall."""
    if turn is not None and turn < 1:
        raise ValueError(f"turn must be >= 1 (the best of the first N turns), got {turn}")
    metrics = ["correct", *(f"fast_{p:g}" for p in fast_ps), "mean_speedup"]
    info_a, info_b = _problem_info(a), _problem_info(b)
    changed = sorted(i for i in info_a.keys() & info_b.keys() if info_a[i][1] != info_b[i][1])
    if changed:
        raise ValidationError(
            f"problem_hash differs between the runs for {changed[:5]}{' ...' if len(changed) > 5 else ''}: "
            "the two files evaluated different problem sources under the same instance_id"
        )
    vals_a, vals_b = per_problem_values(a, metrics, turn), per_problem_values(b, metrics, turn)
    paired = sorted(vals_a.keys() & vals_b.keys(), key=lambda i: (info_a[i][0], i))
    if not paired:
        raise ValidationError("the two runs have no (non-aborted) problem in common")
    levels = sorted({info_a[i][0] for i in paired})
    rows = []
    for level in [*(str(x) for x in levels), "all"]:
        ids = [i for i in paired if level == "all" or str(info_a[i][0]) == level]
        for m in metrics:
            pairs = [(vals_a[i][m], vals_b[i][m]) for i in ids]
            pairs_ok = [(x, y) for x, y in pairs if x is not None and y is not None]
            ci = None
            if pairs_ok:
                ci = paired_bootstrap(
                    [x for x, _ in pairs_ok],
                    [y for _, y in pairs_ok],
                    resamples=resamples,
                    confidence=confidence,
                    seed=seed,
                )
            rows.append(MetricDiff(level=level, metric=m, ci=ci))
    return Comparison(
        label_a=label_a,
        label_b=label_b,
        paired=paired,
        only_a=sorted(vals_a.keys() - vals_b.keys()),
        only_b=sorted(vals_b.keys() - vals_a.keys()),
        metrics=metrics,
        rows=rows,
        problems=[(i, info_a[i][0], vals_a[i], vals_b[i]) for i in paired],
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        turn=turn,
    )


def _fmt(value: float | None, metric: str, signed: bool = False) -> str:
    if value is None:
        return "-"
    if metric == "mean_speedup":
        return f"{value:+.3f}x" if signed else f"{value:.3f}x"
    return f"{100 * value:+.1f} pp" if signed else f"{100 * value:.1f}%"


def render_comparison(c: Comparison, *, max_problems: int = 50) -> str:
    """Markdown: the metric table with CIs, then the problems whose values differ."""
    pct = f"{100 * c.confidence:g}%"
    out = [f"# {c.label_b} (B) vs {c.label_a} (A)", ""]
    out.append(
        f"Paired problems: {len(c.paired)} (only in A: {len(c.only_a)}, only in B: {len(c.only_b)}). "
        f"Outcome: best of {'all turns' if c.turn is None else f'the first {c.turn} turn(s)'}. "
        f"Paired bootstrap over problems: {c.resamples} resamples, seed {c.seed}, {pct} percentile interval."
    )
    rows = []
    for r in c.rows:
        level = "all" if r.level == "all" else f"L{r.level}"
        if r.ci is None:
            rows.append([level, r.metric, 0, "-", "-", "-", "-", "-"])
            continue
        ci = r.ci
        sig = " *" if ci.low > 0 or ci.high < 0 else ""
        rows.append(
            [
                level,
                r.metric,
                ci.n,
                _fmt(ci.mean_a, r.metric),
                _fmt(ci.mean_b, r.metric),
                _fmt(ci.diff, r.metric, True) + sig,
                f"[{_fmt(ci.low, r.metric, True)}, {_fmt(ci.high, r.metric, True)}]",
                f"{ci.p_b_better:.2f}",
            ]
        )
    header = ["level", "metric", "problems", "A", "B", "B - A", f"{pct} CI", "P(B > A)"]
    out += ["", markdown_table(header, rows)]
    out += ["", "`*`: the interval excludes 0. mean_speedup counts an incorrect sample as 0x.", ""]
    differing = [p for p in c.problems if any(p[2][m] != p[3][m] for m in c.metrics)]
    differing.sort(key=lambda p: -abs((p[3]["correct"] or 0) - (p[2]["correct"] or 0)))
    out += [f"## Problems that differ ({len(differing)} of {len(c.paired)})", ""]
    if differing:
        header = ["problem", "level", *(f"{m} A -> B" for m in c.metrics)]
        rows = [
            [pid, level, *(f"{_fmt(va[m], m)} -> {_fmt(vb[m], m)}" for m in c.metrics)]
            for pid, level, va, vb in differing[:max_problems]
        ]
        out.append(markdown_table(header, rows))
        if len(differing) > max_problems:
            out.append(f"\n({len(differing) - max_problems} more not shown)")
    if c.only_a or c.only_b:
        out += ["", f"Only in A: {', '.join(c.only_a) or '-'}", f"Only in B: {', '.join(c.only_b) or '-'}"]
    return "\n".join(out) + "\n"
