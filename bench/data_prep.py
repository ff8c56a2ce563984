"""Throughput of the KernelBook -> SFT static stage (conversion, Inductor rewrite, answer checks,
eval-server static rules, dedup, prompt building): how long a full KernelBook pass takes before
any evaluation. Rows are the KernelBook-shaped fixtures of bench/synthetic_data.py, made distinct
(each copy's module differs by a constant) so that dedup keeps them.

  python bench/data_prep.py --rows 2000 --jobs 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic_data import kernelbook_rows  # noqa: E402
from slime_ext.data.report import FilterReport  # noqa: E402
from slime_ext.data.sft_build import SFTBuildConfig, select_pairs, single_turn_example  # noqa: E402


def synthetic_rows(n: int) -> list[dict]:
    base = kernelbook_rows()
    rows = []
    for i in range(n):
        row = dict(base[i % len(base)])
        row["uuid"] = i
        row["python_code"] = row["python_code"] + f"\n\nVARIANT = {i}\n"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--jobs", type=int, default=1, help="processes for the per-row stage")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    rows = synthetic_rows(args.rows)
    config = SFTBuildConfig(max_reference_chars=100_000)
    report = FilterReport()
    t0 = time.perf_counter()
    pairs = select_pairs(rows, config, report, jobs=args.jobs)
    t1 = time.perf_counter()
    examples = [single_turn_example(pair, config.prompt) for pair in pairs]
    t2 = time.perf_counter()
    result = {
        "rows": args.rows,
        "jobs": args.jobs,
        "kept": len(pairs),
        "dropped": dict(report.dropped),
        "select_s": round(t1 - t0, 3),
        "rows_per_s": round(args.rows / (t1 - t0), 1),
        "examples_s": round(t2 - t1, 3),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if examples else 1


if __name__ == "__main__":
    sys.exit(main())
