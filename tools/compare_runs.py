"""Compare two evaluation runs (results.jsonl of tools/eval_model) problem by problem, with paired
bootstrap confidence intervals of the differences (B - A) in correct rate, fast_p and mean speedup.

  python -m tools.compare_runs runs/eval/base/results.jsonl runs/eval/rl-step200/results.jsonl \\
      --labels base,rl-200 --fast-p 1,1.5 --out runs/eval/base_vs_rl200.md

A results folder may be given instead of its results.jsonl. Train problems are refused unless
--allow-train. Markdown goes to --out (written atomically) or stdout. Exit code 0, or 2 with one
`error: ...` line for a missing or invalid input. See docs/EVAL_REPORTS.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.validation import ValidationError
from slime_ext.reports.compare import compare_runs, render_comparison
from slime_ext.reports.report import atomic_write
from slime_ext.reports.results import load_results
from slime_ext.reports.runner import check_splits

RESULTS_NAME = "results.jsonl"


def _results_path(path: Path) -> Path:
    return path / RESULTS_NAME if path.is_dir() else path


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.compare_runs", __doc__)
    p.add_argument("a", type=Path, help="run A (baseline): results.jsonl or its folder")
    p.add_argument("b", type=Path, help="run B: results.jsonl or its folder")
    p.add_argument("--labels", help="two comma-separated labels (default: the model field of each file)")
    p.add_argument(
        "--fast-p", type=_floats, default=[1.0], help="comma-separated fast_p thresholds to compare"
    )
    p.add_argument("--turn", type=int, help="compare the best of the first N turns (default: all turns)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="bootstrap confidence level")
    p.add_argument("--seed", type=int, default=0, help="bootstrap sampling seed")
    p.add_argument("--allow-train", action="store_true", help="allow train problems in the comparison")
    p.add_argument("--out", type=Path, help="write the markdown here instead of stdout")
    args = p.parse_args(argv)
    try:
        runs = [load_results(_results_path(x)) for x in (args.a, args.b)]
        for records in runs:
            check_splits(records, allow_train=args.allow_train)
        if args.labels:
            labels = [x.strip() for x in args.labels.split(",")]
            if len(labels) != 2 or not all(labels):
                raise ValueError(f"--labels needs two non-empty comma-separated labels, got {args.labels!r}")
        else:
            labels = [
                records[0].model if records else str(path)
                for records, path in zip(runs, (args.a, args.b), strict=True)
            ]
        comparison = compare_runs(
            runs[0],
            runs[1],
            label_a=labels[0],
            label_b=labels[1],
            fast_ps=args.fast_p,
            turn=args.turn,
            resamples=args.resamples,
            confidence=args.confidence,
            seed=args.seed,
        )
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = render_comparison(comparison)
    if args.out:
        atomic_write(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
