"""PNG plots of an evaluation summary (`report.build_summary`): fast_p against p per level, and
the correct rate, fast_1 and geometric-mean speedup against the turn. matplotlib with the Agg
backend (no display needed); each function returns the PNG bytes, the caller writes them."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from slime_ext.reports.run_status import DEVICE_RATE_PREFIX, WINDOW_RATE_KEY, turn_index

__all__ = ["RUN_CURVES", "plot_fast_p", "plot_run_curve", "plot_turns"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # optional dependency: the `reports` extra
        raise RuntimeError(
            "plots need matplotlib: pip install -e '.[reports]' (or skip plots with --no-plots)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _groups(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        ("all levels" if k == "all" else f"level {k}", g)
        for k, g in summary["metrics"].items()
        if "final" in g
    ]


def _png(fig: Any, plt: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plot_fast_p(summary: Mapping[str, Any]) -> bytes:
    """fast_p (final outcome) against p, one line per level."""
    plt = _pyplot()
    thresholds = summary["thresholds"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, g in _groups(summary):
        values = [100.0 * (g["final"]["fast_p"][f"{p:g}"] or 0.0) for p in thresholds]
        style = "k--" if label == "all levels" else "-"
        ax.plot(thresholds, values, style, marker="o", label=f"{label} ({g['problems']} problems)")
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel("fast_p (% correct with speedup > p)")
    ax.set_ylim(0, 100)
    title = f"fast_p: {summary['run'].get('model', '')}"
    untimed = summary["metrics"].get("all", {}).get("final", {}).get("untimed_correct", 0)
    if untimed:
        title += f"\n({untimed} correct samples untimed: not fast for p > 0)"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig, plt)


def plot_turns(summary: Mapping[str, Any]) -> bytes:
    """Correct rate, fast_1 and geomean speedup of the best of the first t turns, against t."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (
        ("correct rate (%)", True, lambda t: 100.0 * (t["fast_p"]["0"] or 0.0)),
        ("fast_1 (%)", True, lambda t: None if "1" not in t["fast_p"] else 100.0 * (t["fast_p"]["1"] or 0.0)),
        ("geomean speedup (correct, timed)", False, lambda t: t["geomean_speedup"]),
    )
    groups = _groups(summary)
    turns = sorted({t["turn"] for _, g in groups for t in g["per_turn"]})
    for ax, (title, is_rate, value) in zip(axes, panels, strict=True):
        drawn = False
        for label, g in groups:
            pts = [(t["turn"], value(t)) for t in g["per_turn"] if value(t) is not None]
            if pts:
                style = "k--" if label == "all levels" else "-"
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=label)
                drawn = True
        if not drawn:
            ax.text(
                0.5,
                0.5,
                "no data (no timed correct samples)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        if is_rate:
            ax.set_ylim(0, 100)
        if turns:
            ax.set_xticks(turns)
            ax.set_xlim(turns[0] - 0.2, turns[-1] + 0.2)
        ax.set_xlabel("turn (best of the first t)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"metrics by turn: {summary['run'].get('model', '')}", fontsize=11)
    return _png(fig, plt)


# name -> (title, y label, [(series label, metric key), ...]) for a training run's curves; the
# per-turn correct rate is added by plot_run_curve from the keys present.
RUN_CURVES: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "reward": ("rollout reward", "mean return", [("mean return", "rollout/kernel/mean_return")]),
    "correct_rate": ("correct rate by turn", "share of trajectories", [("any turn", "rollout/kernel/correct_rate")]),
    "loss": ("policy loss", "loss", [("loss", "train/loss"), ("pg loss", "train/pg_loss")]),
    "kl": ("KL", "KL", [("kl loss", "train/kl_loss"), ("ppo kl", "train/ppo_kl")]),
    "grad_norm": ("gradient norm", "norm", [("grad norm", "train/grad_norm")]),
    # since the server started, in the loop (between two steps), and, added by plot_run_curve, per device
    "evals_per_min": ("eval server", "evaluations / min", [("since start", "eval/per_min"),
                                                          ("in the loop", WINDOW_RATE_KEY)]),
    "step_time": ("step time", "seconds", [("step", "perf/step_time"), ("train", "perf/train_time"),
                                           ("rollout", "perf/rollout_time"),
                                           ("weight update", "perf/update_weights_time")]),
    "episode_time": ("episode time (mean)", "seconds", [("episode", "rollout/kernel/episode_s/mean"),
                                                      ("generate", "rollout/kernel/episode_generate_s/mean"),
                                                      ("evaluate", "rollout/kernel/episode_eval_s/mean")]),
    # the server's latency and, added by plot_run_curve, each phase that took >= 0.05 s at some step
    "eval_phases": ("evaluation time by phase (mean)", "seconds",
                    [("server total", "rollout/kernel/eval_latency_s/mean")]),
    # one line per status, and per check id that ended a turn, added by run_curve_series
    "statuses": ("evaluation statuses", "share of evaluated turns", []),
    "checks": ("checks that ended a turn", "share of evaluated turns", []),
}  # fmt: skip
STATUS_PREFIX = "rollout/kernel/status/"
CHECK_PREFIX = "rollout/kernel/check/"
EVAL_PHASE_PREFIX = "rollout/kernel/eval_phase_s/"
MIN_PHASE_S = 0.05  # a phase never this long stays off the plot (a dozen lines would hide the rest)


def run_curve_series(name: str, rows: Mapping[int, Mapping[str, float]]) -> list[tuple[str, str]]:
    """(label, metric key) of each line of RUN_CURVES[name] that `rows` has: the fixed series,
    plus one per turn (correct_rate) or per phase of >= MIN_PHASE_S (eval_phases)."""
    series = RUN_CURVES[name][2]
    if name == "correct_rate":
        turns = {t: f"rollout/kernel/turn{t}/correct_rate" for r in rows.values() for k in r
                 if k.endswith("/correct_rate") and (t := turn_index(k)) is not None}  # fmt: skip
        series = series + [(f"turn {t + 1}", turns[t]) for t in sorted(turns)]
    if name == "evals_per_min":
        devices = sorted({k for r in rows.values() for k in r if k.startswith(DEVICE_RATE_PREFIX)})
        series = series + [(k[len(DEVICE_RATE_PREFIX) :], k) for k in devices]
    if name == "eval_phases":
        longest: dict[str, float] = {}
        for r in rows.values():
            for k, v in r.items():
                if k.startswith(EVAL_PHASE_PREFIX) and isinstance(v, (int, float)):
                    longest[k] = max(longest.get(k, 0.0), float(v))
        series = series + [(k[len(EVAL_PHASE_PREFIX) :].removesuffix("/mean"), k)
                           for k in sorted(longest) if longest[k] >= MIN_PHASE_S]  # fmt: skip
    for curve, prefix in (("statuses", STATUS_PREFIX), ("checks", CHECK_PREFIX)):
        if name == curve:
            keys = sorted({k for r in rows.values() for k in r if k.startswith(prefix)})
            series = series + [(k[len(prefix) :], k) for k in keys]
    return [(label, key) for label, key in series if any(key in r for r in rows.values())]


def plot_run_curve(name: str, rows: Mapping[int, Mapping[str, float]]) -> bytes | None:
    """One curve of RUN_CURVES over the steps of `rows` ({step: {metric: value}}); None when the
    run has none of its metrics (e.g. no KL loss)."""
    title, ylabel, _ = RUN_CURVES[name]
    present = run_curve_series(name, rows)
    if not present:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, key in present:
        points = sorted(
            (step, float(r[key])) for step, r in rows.items() if isinstance(r.get(key), (int, float))
        )
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(present) > 1:
        ax.legend()
    return _png(fig, plt)
