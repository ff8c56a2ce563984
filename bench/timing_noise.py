"""A/A noise of the evaluator: the same correct kernel evaluated N times through the server.

RL reinforces noise as if it were a gain (FIELD_NOTES), so the spread of the reported speedup
for an unchanged kernel is the floor under any real improvement. This runs the production path
(server, reference-timing cache with spot checks, default 100 timing trials) and reports, per
case, the mean and coefficient of variation of the speedup and of the candidate median.

  python bench/timing_noise.py --devices 0 --repeats 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import BENCH_CASES, load_candidate, load_problem  # noqa: E402
from eval_server.launch import running_server  # noqa: E402


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="0")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--cases", default="", help="comma-separated problem names (default: all)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cases = [c for c in BENCH_CASES if not args.cases or c.problem in args.cases.split(",")]
    report = []
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        server_args = ["--devices", args.devices, "--ref-cache", str(Path(tmp) / "ref.sqlite")]
        with running_server(Path(tmp), server_args) as url:
            for case in cases:
                body = {"reference": load_problem(case.problem), "candidate": load_candidate(case.candidate)}
                speedups, cand_ms, ref_ms, sources, runs = [], [], [], [], []
                t0 = time.perf_counter()
                for _ in range(args.repeats):
                    res = httpx.post(f"{url}/eval", json=body, timeout=600).json()
                    if res["status"] != "ok":
                        print(f"{case.problem}: {res['status']}\n{res['feedback'][:500]}", flush=True)
                        break
                    speedups.append(res["speedup"])
                    cand_ms.append(res["candidate_timing"]["median_ms"])
                    ref_ms.append(res["reference_timing"]["median_ms"])
                    sources.append(res["reference_timing_source"])
                    runs.append({k: res[k] for k in ("speedup", "candidate_timing", "reference_timing")})
                if not speedups:
                    continue
                row = {
                    "case": case.problem,
                    "n": len(speedups),
                    "candidate_median_ms": statistics.median(cand_ms),
                    "speedup_mean": statistics.fmean(speedups),
                    "speedup_cv": cv(speedups),
                    "candidate_ms_cv": cv(cand_ms),
                    "reference_ms_cv": cv(ref_ms),
                    "speedup_min": min(speedups),
                    "speedup_max": max(speedups),
                    "reference_sources": sources,
                    "runs": runs,
                    "seconds": time.perf_counter() - t0,
                }
                report.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("reference_sources", "runs")}), flush=True)
    print()
    print(f"{'case':28s} {'n':>3s} {'cand ms':>9s} {'speedup':>8s} {'CV %':>6s} {'cand CV %':>9s}")
    for r in report:
        print(
            f"{r['case']:28s} {r['n']:3d} {r['candidate_median_ms']:9.4f} {r['speedup_mean']:8.3f} "
            f"{100 * r['speedup_cv']:6.2f} {100 * r['candidate_ms_cv']:9.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
