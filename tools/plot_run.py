"""Training curves of a launcher run from its own logs, no W&B needed: PNGs of the rollout reward,
the correct rate by turn, the policy loss, KL, gradient norm, evaluations/min and step time
against the step.

  python -m tools.plot_run RUN_DIR                  # PNGs into RUN_DIR/plots/
  python -m tools.plot_run RUN_DIR --out DIR

The steps come from slime's log (RUN_DIR/logs/trainer.log: its `step N: {...}` and `perf N: {...}`
lines), the eval server's rate from the status window's history (RUN_DIR/status.jsonl). A curve
whose metrics the run never logged is left out (and named).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.fileio import atomic_write
from slime_ext.reports.plots import RUN_CURVES, plot_run_curve
from slime_ext.reports.run_status import HISTORY_NAME, parse_slime_log, window_rates


def step_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """{step: every metric of that step}: slime's train and perf lines, and from the status
    history's row of the step: `eval/per_min` (the eval server's rate since its start) and, from
    the evaluations counted since the previous row, the rate in the loop (`eval/per_min_window`)
    and per device (`eval/per_min/<device>`)."""
    log = run_dir / "logs" / "trainer.log"
    train, perf = parse_slime_log(log.read_text(encoding="utf-8", errors="replace") if log.is_file() else "")
    rows: dict[int, dict[str, float]] = {}
    for source in (train, perf):
        for step, values in source.items():
            rows.setdefault(step, {}).update({k: v for k, v in values.items() if isinstance(v, (int, float))})
    history = run_dir / HISTORY_NAME
    if history.is_file():
        prev: dict[str, Any] | None = None
        for line in history.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            step = row.get("train_step") if row.get("train_step") is not None else row.get("rollout_step")
            ev = row.get("eval") or {}
            if not isinstance(step, int):
                continue
            out = rows.setdefault(step, {})
            if isinstance(ev.get("per_min"), (int, float)):
                out["eval/per_min"] = ev["per_min"]
            if prev is not None:
                out.update(window_rates(prev, row))
            prev = row
    return rows


DRY_RUN_SUMMARY = "rollout_step.json"  # what tools.rollout_step writes where slime's trainer would run


def dry_run_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """A dry run's one rollout step (tools.rollout_step's summary) as step 0: the mean reward and
    the correct rate of each turn; {} when the run has no such summary."""
    path = run_dir / DRY_RUN_SUMMARY
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    row: dict[str, float] = {}
    if isinstance(summary.get("mean_reward"), (int, float)):
        row["rollout/kernel/mean_return"] = float(summary["mean_reward"])
    for turn in summary.get("turns") or []:
        if isinstance(turn, dict) and turn.get("episodes"):
            row[f"rollout/kernel/turn{int(turn['turn']) - 1}/correct_rate"] = (
                turn["correct"] / turn["episodes"]
            )
    return {0: row} if row else {}


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.plot_run", __doc__)
    p.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR of the launcher)")
    p.add_argument("--out", type=Path, help="where the PNGs go (default RUN_DIR/plots)")
    args = p.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"error: {args.run_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    rows = step_rows(args.run_dir)
    if not rows and (rows := dry_run_rows(args.run_dir)):
        print(
            f"{args.run_dir} is a dry run: tools.rollout_step stood in for slime's trainer, so there are no "
            "training steps; plotting its one rollout step"
        )
    if not rows:
        print(
            f"error: no training steps in {args.run_dir}/logs/trainer.log or {HISTORY_NAME} yet",
            file=sys.stderr,
        )
        return 1
    out = args.out or args.run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    try:
        written, missing = [], []
        for name in RUN_CURVES:
            png = plot_run_curve(name, rows)
            if png is None:
                missing.append(name)
                continue
            atomic_write(out / f"{name}.png", png)
            written.append(name)
    except RuntimeError as exc:  # matplotlib missing
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(rows)} steps; wrote {', '.join(f'{n}.png' for n in written)} to {out}")
    if missing:
        print(f"not logged by this run: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
