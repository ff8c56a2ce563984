"""Compare training runs of two recipe choices (arms) over seeds: per run, each metric's level
is its mean over the last `last_share` of the run's logged steps; arm B minus arm A is the mean
over seeds of the paired differences (run i of each arm shares seed i), with the paired
bootstrap's percentile interval over the seeds (compare.paired_bootstrap). With two seeds an
interval spans little more than the two differences: the report says how many pairs it had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slime_ext.reports.compare import BootstrapCI, paired_bootstrap
from slime_ext.reports.report import markdown_table

__all__ = [
    "DEFAULT_METRICS",
    "MetricComparison",
    "compare_training",
    "render_training_comparison",
    "run_level",
]

DEFAULT_METRICS = (
    "rollout/kernel/correct_rate",
    "rollout/kernel/mean_return",
    "rollout/kernel/turn1/correct_rate",
    "rollout/kernel/role/fixer/correct_rate",
    "perf/step_time",
)
Rows = Mapping[int, Mapping[str, float]]  # {step: {metric: value}} (tools.plot_run.step_rows)


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    levels_a: list[float | None]  # per seed
    levels_b: list[float | None]
    ci: BootstrapCI | None  # None: no seed with the metric logged in both arms


def run_level(rows: Rows, metric: str, last_share: float) -> float | None:
    """Mean of `metric` over the last `last_share` of the steps that logged it (at least one)."""
    if not 0.0 < last_share <= 1.0:
        raise ValueError(f"last_share must be in (0, 1], got {last_share}")
    values = [float(rows[s][metric]) for s in sorted(rows) if metric in rows[s]]
    if not values:
        return None
    keep = max(1, round(len(values) * last_share))
    return sum(values[-keep:]) / keep


def compare_training(
    arm_a: Sequence[Rows],
    arm_b: Sequence[Rows],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    last_share: float = 1 / 3,
    seed: int = 0,
) -> list[MetricComparison]:
    """Per metric, the levels of every run and the paired B - A interval over the seeds."""
    if len(arm_a) != len(arm_b) or not arm_a:
        raise ValueError(
            f"the arms need the same number of runs (one per seed, in seed order), got {len(arm_a)} and {len(arm_b)}"
        )
    out = []
    for metric in metrics:
        la = [run_level(r, metric, last_share) for r in arm_a]
        lb = [run_level(r, metric, last_share) for r in arm_b]
        pairs = [(a, b) for a, b in zip(la, lb, strict=True) if a is not None and b is not None]
        ci = paired_bootstrap([a for a, _ in pairs], [b for _, b in pairs], seed=seed) if pairs else None
        out.append(MetricComparison(metric, la, lb, ci))
    return out


def _f(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.4g}" if signed else f"{value:.4g}")


def render_training_comparison(
    comparisons: Sequence[MetricComparison],
    labels: tuple[str, str],
    runs: tuple[Sequence[str], Sequence[str]],
    last_share: float,
) -> str:
    """Markdown: the runs, then one row per metric (each arm's seed mean and levels, B - A and
    its 95 % interval, the share of resamples where B is above A, the pairs)."""
    a, b = labels
    lines = [
        f"# {b} vs {a}: {len(runs[0])} seed(s) each",
        "",
        f"Level of a run: the mean of a metric over the last {last_share:.0%} of its logged steps. "
        f"Runs paired by seed: {', '.join(f'{x} ~ {y}' for x, y in zip(runs[0], runs[1], strict=True))}.",
        "",
    ]
    rows = []
    for c in comparisons:
        if c.ci is None:
            rows.append([c.metric, "-", "-", "not logged in both arms", "-", "-", "0"])
            continue
        rows.append([
            c.metric,
            f"{_f(c.ci.mean_a)} ({', '.join(_f(v) for v in c.levels_a)})",
            f"{_f(c.ci.mean_b)} ({', '.join(_f(v) for v in c.levels_b)})",
            _f(c.ci.diff, signed=True),
            f"[{_f(c.ci.low, signed=True)}, {_f(c.ci.high, signed=True)}]",
            f"{c.ci.p_b_better:.2f}",
            str(c.ci.n),
        ])  # fmt: skip
    header = [
        "metric",
        f"{a}: mean (per seed)",
        f"{b}: mean (per seed)",
        f"{b} - {a}",
        "95 % interval",
        "P(B > A)",
        "pairs",
    ]
    lines.append(markdown_table(header, rows))
    lines += [
        "",
        "An interval that holds 0 is no measured difference at this scale; with 2 pairs it is the "
        "range of the two differences, not a guarantee.",
    ]
    return "\n".join(lines) + "\n"
