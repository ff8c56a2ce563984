"""Evaluator throughput on KernelBench-sized problems, against the common-practice baseline.

In one invocation:
1. starts our eval server on the chosen GPU(s) with a fresh reference-timing cache, and
   evaluates every bench case `--repeats` times (5 correctness trials + 100 timing trials
   each, the defaults): evaluations/min, p50/p95 latency, mean seconds per phase, and the
   first (cold: Triton compile, reference timed) vs later (warm) latency;
2. runs `bench/baseline_eval.py` as a fresh process per evaluation (inputs from get_inputs()
   on the CPU, the common practice) `--baseline-repeats` times per case, on the same GPU;
3. prints both and the throughput ratio; `--json` writes everything.

  python bench/eval_throughput.py --devices 0 --repeats 3 --baseline-repeats 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import BENCH_CASES, load_candidate, load_problem  # noqa: E402
from eval_server.launch import running_server  # noqa: E402
from eval_server.pool import percentile  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent


def run_ours(
    devices: str, workers_per_device: int, repeats: int, cases: list, tmp: Path, timeout_s: float
) -> dict:
    """Every case `repeats` times; up to 2 requests per worker in flight so the queue never runs dry."""
    rows: list[dict] = []
    args = ["--devices", devices, "--workers-per-device", str(workers_per_device),
            "--ref-cache", str(tmp / "ref_cache.sqlite"), "--timeout-s", str(timeout_s)]  # fmt: skip
    jobs = [(rep, case) for rep in range(repeats) for case in cases]
    n_workers = workers_per_device * len(devices.split(","))
    with running_server(tmp, args) as url:
        t0 = time.perf_counter()

        def one(job: tuple[int, object]) -> None:
            rep, case = job
            body = {
                "reference": load_problem(case.problem),
                "candidate": load_candidate(case.candidate),
                "problem_id": case.problem,
            }
            t = time.perf_counter()
            res = httpx.post(f"{url}/eval", json=body, timeout=timeout_s + 600).json()
            latency = time.perf_counter() - t
            rows.append(
                {
                    "case": case.problem,
                    "repeat": rep,
                    "latency_s": latency,
                    "status": res["status"],
                    "speedup": res["speedup"],
                    "phases": res["phases"],
                    "reference_timing_source": res.get("reference_timing_source"),
                    "checks": [c["id"] for c in res["checks"]],
                    "feedback": res["feedback"][:400] if res["status"] != "ok" else "",
                    "elapsed_in_worker_s": res["elapsed_s"],
                }
            )
            print(
                f"ours  {case.problem:28s} rep {rep}  {res['status']:14s} {latency:6.2f} s "
                f"(in worker {res['elapsed_s']:.2f} s)  "
                f"speedup {res['speedup'] if res['speedup'] is None else round(res['speedup'], 3)}  "
                f"{res.get('reference_timing_source') or ''}",
                flush=True,
            )

        with ThreadPoolExecutor(max_workers=2 * n_workers) as ex:
            list(ex.map(one, jobs))
        wall = time.perf_counter() - t0
    # Latency of one evaluation = time in the worker (queueing behind the other request excluded).
    lat = [r["elapsed_in_worker_s"] for r in rows]
    warm = [r["elapsed_in_worker_s"] for r in rows if r["repeat"] > 0]
    phases: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["phases"].items():
            phases.setdefault(k, []).append(v)
    return {
        "evaluations": len(rows),
        "wall_s": wall,
        "evals_per_min": 60 * len(rows) / wall,
        "p50_s": percentile(lat, 0.5),
        "p95_s": percentile(lat, 0.95),
        "warm_p50_s": percentile(warm, 0.5) if warm else None,
        "cold_mean_s": statistics.fmean(r["elapsed_in_worker_s"] for r in rows if r["repeat"] == 0),
        "phase_mean_s": {k: statistics.fmean(v) for k, v in sorted(phases.items())},
        "rows": rows,
    }


def run_baseline(device: str, repeats: int, cases: list, timeout_s: float) -> dict:
    rows = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
    t0 = time.perf_counter()
    for rep in range(repeats):
        for case in cases:
            cmd = [
                sys.executable, str(BENCH_DIR / "baseline_eval.py"),
                "--problem", str(BENCH_DIR / "problems" / f"{case.problem}.py"),
                "--candidate", str(BENCH_DIR / "candidates" / f"{case.candidate}.py"),
            ]  # fmt: skip
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            latency = time.perf_counter() - t
            try:
                out = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out = {"error": proc.stderr[-800:]}
            rows.append({"case": case.problem, "repeat": rep, "latency_s": latency, **out})
            print(
                f"base  {case.problem:28s} rep {rep}  {latency:6.2f} s  {json.dumps(out)[:160]}", flush=True
            )
    wall = time.perf_counter() - t0
    lat = [r["latency_s"] for r in rows]
    return {
        "evaluations": len(rows),
        "wall_s": wall,
        "evals_per_min": 60 * len(rows) / wall,
        "p50_s": percentile(lat, 0.5),
        "p95_s": percentile(lat, 0.95),
        "rows": rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="0", help="GPU id(s) for our server; the baseline uses the first")
    p.add_argument("--workers-per-device", default="1", help="comma-separated: run our server once per value")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline-repeats", type=int, default=1)
    p.add_argument("--cases", default="", help="comma-separated problem names (default: all)")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cases = [c for c in BENCH_CASES if not args.cases or c.problem in args.cases.split(",")]
    results: dict[str, dict | None] = {}
    for wpd in [int(w) for w in args.workers_per_device.split(",")]:
        with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
            results[f"ours_{wpd}_per_gpu"] = run_ours(
                args.devices, wpd, args.repeats, cases, Path(tmp), args.timeout_s
            )
    base = (
        run_baseline(args.devices.split(",")[0], args.baseline_repeats, cases, args.timeout_s)
        if args.baseline_repeats
        else None
    )
    results["baseline"] = base
    print()
    print(f"{'':18s} {'evals':>6s} {'wall s':>8s} {'evals/min':>10s} {'p50 s':>7s} {'p95 s':>7s}")
    for name, r in results.items():
        if r:
            print(
                f"{name:18s} {r['evaluations']:6d} {r['wall_s']:8.1f} {r['evals_per_min']:10.2f} {r['p50_s']:7.2f} {r['p95_s']:7.2f}"
            )
    for name, r in results.items():
        if r and name != "baseline":
            if base:
                print(f"throughput ratio {name}/baseline: {r['evals_per_min'] / base['evals_per_min']:.1f}x")
            print(f"{name}: warm p50 {r['warm_p50_s']}, cold mean {r['cold_mean_s']:.2f} s")
            print(
                f"{name} phase means (s):", json.dumps({k: round(v, 3) for k, v in r["phase_mean_s"].items()})
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    bad = [
        row
        for name, r in results.items()
        if r and name != "baseline"
        for row in r["rows"]
        if row["status"] != "ok"
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
