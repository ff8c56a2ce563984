"""The run's status on one screen, refreshed: windows (running, or exited with code and last log
line), the trainer's last step (loss, grad norm, KL, step time) and rollout (reward, correct and
compile rates), the eval server (evaluations/min, queue, statuses, p50), the buffer (groups ready,
policy version, runner counters) and GPU use.

  python -m tools.status RUN_DIR                  # live, every 5 s (the launcher's `status` window)
  python -m tools.status RUN_DIR --once           # one snapshot, then exit
  python -m tools.status RUN_DIR --on-exit stop   # when a window's command ends: stop the run

`--on-exit stop` (the launcher's default, ON_EXIT=stop) runs scripts/stop.sh RUN_DIR as soon as
any window's command has ended (the trainer finishing or crashing, a server dying), after saying
which one, its exit code and its last log line; `wait` (the default here) only shows it. Every
new trainer step is also appended to RUN_DIR/status.jsonl (tools/plot_run.py plots it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.reports.run_status import (
    DEVICE_RATE_PREFIX,
    WINDOW_RATE_KEY,
    append_history,
    snapshot,
    turn_index,
    window_rates,
)

REPO = Path(__file__).resolve().parents[1]
_TRAIN_KEYS = (("loss", "train/loss"), ("grad norm", "train/grad_norm"), ("KL", "train/kl_loss"),
               ("ppo KL", "train/ppo_kl"), ("logprob diff", "train/train_rollout_logprob_abs_diff"),
               ("step s", "perf/step_time"), ("train s", "perf/train_time"))  # fmt: skip
_ROLLOUT_PREFIX = "rollout/kernel/"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _seconds(value: Any) -> str:
    """A duration with its unit, or "-" alone when there is none yet."""
    return "-" if value is None else f"{_fmt(value)} s"


def render(snap: dict[str, Any], earlier: dict[str, Any] | None = None) -> Any:
    """The snapshot as rich tables (imported here: the library side needs no terminal UI);
    `earlier`, a snapshot of up to RATE_WINDOW_S before, adds the eval server's current rate."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]run[/] {snap['run']}",
        f"session {snap.get('session') or '-'}",
        time.strftime("%H:%M:%S", time.localtime(snap["time"])),
    )
    parts.append(head)

    windows = Table(title="windows", title_justify="left", expand=True)
    for col in ("window", "state", "last log line"):
        windows.add_column(col, overflow="fold" if col == "last log line" else None)
    for w in snap["windows"]:
        state = w["state"] if w["state"] != "exited" else f"[red]exited ({_fmt(w['exit_code'])})[/]"
        windows.add_row(w["name"], state, w["last_line"])
    parts.append(windows)

    trainer = Table(title=f"trainer: step {_fmt(snap['train_step'])}", title_justify="left")
    for name, _ in _TRAIN_KEYS:
        trainer.add_column(name)
    timing = {**snap["rollout"], **snap["train"]}  # slime logs its step timings in `perf N` lines
    trainer.add_row(*[_fmt(timing.get(key)) for _, key in _TRAIN_KEYS])
    parts.append(trainer)

    rollout = {
        k[len(_ROLLOUT_PREFIX) :]: v for k, v in snap["rollout"].items() if k.startswith(_ROLLOUT_PREFIX)
    }
    if rollout:
        per_turn = ("n", "compile_rate", "correct_rate", "fast_1_rate", "mean_reward")
        headline = (
            "mean_return",
            "correct_rate",
            "compile_rate",
            "fast_1_rate",
            "mean_turns",
            "aborted_rate",
        )
        table = Table(title=f"rollout: step {_fmt(snap['rollout_step'])}", title_justify="left")
        table.add_column("turn")
        for key in per_turn:
            table.add_column(key)
        turns = sorted({t for k in rollout if (t := turn_index(k)) is not None})
        for t in turns:
            table.add_row(str(t + 1), *[_fmt(rollout.get(f"turn{t}/{k}")) for k in per_turn])
        caption = ["  ".join(f"{k} {_fmt(rollout[k])}" for k in headline if k in rollout)]
        for label, prefix in (("statuses", "status/"), ("ended by", "check/")):
            shares = sorted(((k[len(prefix) :], v) for k, v in rollout.items() if k.startswith(prefix)),
                            key=lambda kv: -kv[1])  # fmt: skip
            if shares:
                caption.append(f"{label}: " + ", ".join(f"{name} {_fmt(v)}" for name, v in shares))
        table.caption = "\n".join(c for c in caption if c)
        parts.append(table)
    recent = snap.get("recent_rollouts") or []
    if len(recent) > 1:
        steps = Table(title="last rollout steps", title_justify="left")
        for col in ("step", "mean return", "correct rate", "compile rate"):
            steps.add_column(col)
        for row in recent:
            steps.add_row(
                str(row["step"]), *[_fmt(row[k]) for k in ("mean_return", "correct_rate", "compile_rate")]
            )
        parts.append(steps)

    def silent(name: str) -> str:
        """A service that did not answer: stopped with the run, its window ended, or lost."""
        if snap.get("stopped"):
            return f"stopped (the run was stopped at {snap['stopped']})"
        window = next((w for w in snap["windows"] if w["name"] == name), None)
        if window is not None and window["state"] == "exited":
            return f"stopped (its window exited with code {_fmt(window['exit_code'])})"
        return "unreachable"

    services = Table(title="services", title_justify="left")
    services.add_column("service")
    services.add_column("state")
    ev = snap.get("eval")
    services.add_row(
        "eval",
        silent("eval")
        if ev is None
        else f"{ev['evaluations']} evaluations ({_fmt(ev['per_min'])}/min since start{_now_rate(earlier, snap)}), "
        f"in flight {_fmt(ev['in_flight'])}, "
        f"queued {_fmt(ev['queued'])}, p50 {_seconds(ev['p50_s'])}, "
        + ", ".join(f"{k} {v}" for k, v in sorted(ev["by_status"].items())),
    )
    buf = snap.get("buffer")
    services.add_row(
        "buffer",
        silent("buffer")
        if buf is None
        else f"groups ready {_fmt(buf['groups_ready'])}, consumed {_fmt(buf['groups_consumed'])}, "
        f"records {_fmt(buf['records'])}, policy version {_fmt(buf['policy_version'])}, stale records "
        f"dropped {_fmt(buf['stale_records_dropped'])} (max staleness {_fmt(buf['max_staleness'])}), dropped groups "
        + ", ".join(f"{k} {v}" for k, v in sorted(buf["dropped_groups"].items())),
    )
    runner = (buf or {}).get("runner")
    if runner:
        services.add_row(
            "runner",
            f"{runner['state']}, epoch {_fmt(runner['epoch'])}, episodes {runner['episodes_done']}"
            f"/{_fmt(runner['episodes_expected'])} ({_fmt(runner['episodes_per_s'])}/s), in flight "
            f"{_fmt(runner['in_flight'])}, aborted {_fmt(runner['aborted'])}"
            + (f", outage pause {runner['outage_pause_s']} s" if runner["outage_pause_s"] else "")
            + (f", last error: {runner['last_error']}" if runner["last_error"] else ""),
        )
    fleet = snap.get("fleet")
    if fleet:
        up = sum(1 for r in fleet["servers"] if r.get("alive"))
        services.add_row(
            "eval fleet", f"{up} of {len(fleet['servers'])} servers up, {len(fleet['nodes'])} node(s)"
        )
        for row in fleet["servers"]:
            st = row.get("stats")
            services.add_row(
                f"  {row['name']}",
                f"{row.get('url') or '-'} (node {str(row.get('node_id', '?'))[:8]}, GPU {row.get('gpu') or '-'}): "
                + (
                    f"{st['evaluations']} evaluations ({_fmt(st['per_min'])}/min), in flight {_fmt(st['in_flight'])}"
                    if st
                    else (row.get("error") or "not answering")
                ),
            )
        for node in fleet["nodes"]:
            res = node.get("resources") or {}
            services.add_row(
                f"  node {node['address']}",
                ("alive" if node.get("alive") else "[red]dead[/]")
                + f", GPUs {_fmt(res.get('GPU', 0))}, eval slots {_fmt(res.get('krl_eval', 0))}",
            )
    for gpu in snap.get("gpus") or []:
        services.add_row(
            f"GPU {gpu['index']}",
            f"{gpu['util_pct']:.0f} % busy, {gpu['mem_used_mib'] / 1024:.1f} / {gpu['mem_total_mib'] / 1024:.1f} GiB",
        )
    parts.append(services)
    return Group(*parts)


def _stop_run(run_dir: Path) -> None:
    """scripts/stop.sh in its own session: it stops this window's process group too, and must
    outlive it."""
    log = run_dir / "logs" / "stop.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "ab") as out:
        subprocess.Popen(
            ["bash", str(REPO / "scripts" / "stop.sh"), str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


RATE_WINDOW_S = 60.0  # the current evaluation rate is taken over about this long


def _now_rate(earlier: dict[str, Any] | None, snap: dict[str, Any]) -> str:
    """', now X/min (cuda:0 a, cuda:1 b)' from two snapshots, or '' without an earlier one."""
    rates = window_rates(earlier, snap) if earlier is not None else {}
    if WINDOW_RATE_KEY not in rates:
        return ""
    per_device = [f"{k.removeprefix(DEVICE_RATE_PREFIX)} {_fmt(round(v, 1))}" for k, v in sorted(rates.items())
                  if k.startswith(DEVICE_RATE_PREFIX)]  # fmt: skip
    devices = f" ({', '.join(per_device)})" if len(per_device) > 1 else ""
    return f", now {_fmt(round(rates[WINDOW_RATE_KEY], 1))}/min{devices}"


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.status", __doc__)
    p.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR of the launcher)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between refreshes")
    p.add_argument("--width", type=int, default=150, help="columns to draw when stdout is not a terminal")
    p.add_argument("--on-exit", choices=("wait", "stop"), default="wait", help="when a window's command ends")
    args = p.parse_args(argv)
    if not (args.run_dir / "run.env").is_file():
        print(f"error: {args.run_dir} is not a run directory (no run.env)", file=sys.stderr)
        return EXIT_USAGE
    if args.interval <= 0:
        p.error("--interval must be > 0")
    from rich.console import Console
    from rich.live import Live

    # In a launcher window stdout is the window's log tee, not the terminal: draw for the pane
    # anyway (the log then holds the frames too, one every --interval).
    live_pane = not args.once and not sys.stdout.isatty()
    console = Console(force_terminal=True, width=args.width) if live_pane else Console()
    if args.once:
        snap = snapshot(args.run_dir)
        append_history(args.run_dir, snap)
        console.print(render(snap))
        return 0
    try:
        with Live(render(snapshot(args.run_dir)), console=console, auto_refresh=False) as live:
            recent: list[dict[str, Any]] = []  # snapshots of the last RATE_WINDOW_S, oldest first
            while True:
                snap = snapshot(args.run_dir)
                append_history(args.run_dir, snap)
                recent = [r for r in recent if snap["time"] - r["time"] <= RATE_WINDOW_S]
                live.update(render(snap, recent[0] if recent else None), refresh=True)
                recent.append(snap)
                ended = [w for w in snap["windows"] if w["state"] == "exited"]
                if ended and args.on_exit == "stop":
                    break
                time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    for w in ended:
        console.print(
            f"[bold red]window {w['name']} exited with code {_fmt(w['exit_code'])}[/]: {w['last_line']}"
        )
    console.print(f"stopping the run (--on-exit stop): scripts/stop.sh {args.run_dir}")
    _stop_run(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
