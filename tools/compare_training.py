"""Compare two recipe choices over seeded training runs (slime_ext/reports/training_compare.py):
each run's level of a metric (its mean over the last third of the run's steps, from the run's own
logs as tools.plot_run reads them), and arm B minus arm A paired by seed with a bootstrap interval.

  python -m tools.compare_training --a runs/grpo-s1,runs/grpo-s2 --b runs/trloo-s1,runs/trloo-s2 \\
      --labels grpo,trloo [--last 0.34] [--metrics rollout/kernel/correct_rate,...] [--out ab.md]

Run i of each arm must share seed i. Exit code 0, or 2 with one `error: ...` line (a missing run
directory, unequal arms, a run without any logged step).
"""

from __future__ import annotations

import sys
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.fileio import atomic_write
from slime_ext.reports.training_compare import DEFAULT_METRICS, compare_training, render_training_comparison
from tools.plot_run import step_rows


def _runs(text: str) -> list[Path]:
    return [Path(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.compare_training", __doc__)
    p.add_argument("--a", required=True, help="run directories of arm A, comma-separated, in seed order")
    p.add_argument("--b", required=True, help="run directories of arm B, the same seeds in the same order")
    p.add_argument("--labels", default="A,B", help="names of the two arms")
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated metric keys")
    p.add_argument(
        "--last", type=float, default=1 / 3, help="share of each run's last steps that make its level"
    )
    p.add_argument("--out", type=Path, help="markdown here (default: stdout)")
    args = p.parse_args(argv)
    runs_a, runs_b = _runs(args.a), _runs(args.b)
    labels = tuple(x.strip() for x in args.labels.split(","))
    try:
        if len(labels) != 2:
            raise ValueError(f"--labels needs two names, got {args.labels!r}")
        rows = {}
        for run in [*runs_a, *runs_b]:
            if not run.is_dir():
                raise ValueError(f"{run}: not a run directory")
            rows[run] = step_rows(run)
            if not rows[run]:
                raise ValueError(f"{run}: no logged step (logs/trainer.log has no `step N:` line)")
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
        comparisons = compare_training(
            [rows[r] for r in runs_a], [rows[r] for r in runs_b], metrics, last_share=args.last
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = render_training_comparison(
        comparisons, (labels[0], labels[1]), ([str(r) for r in runs_a], [str(r) for r in runs_b]), args.last
    )
    if args.out:
        atomic_write(args.out, text.encode())
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
