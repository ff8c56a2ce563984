"""Does a process that ran the CUDA activity profiler (CUPTI) see longer synchronize tails in its
timings afterwards? Evaluations of a legitimate ~2 us kernel were rejected by the tail check in
all three timings now and then (bench/escape_after_failure.py: 4-10 % on an H100), whole
evaluations at a time, as if a state of the process; bench/spare_interference_probe.py, whose
timing process never profiles, saw no escaped timing at all. Every evaluation child profiles
(its preparation starts the profiler once, the correctness phase checks the first call).

Fresh processes, alternating between modes: `plain` (context, then timings) and `cupti`
(context, the profiler run twice as an evaluation child runs it, then timings). Each times a
64x1000 ReLU as the evaluator does (`time_gpu`, 32 calls per trial, adaptive) `--timings`
times and reports each timing's tail-check excess per trial (`escape_tail_ms` x 32, in us:
negative when it passed), the launch check's, and whether it escaped.

  python3 bench/sync_tail_probe.py --processes 12 --json sync_tail.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("plain", "cupti")


def child(mode: str, timings: int) -> list[dict[str, Any]]:
    """One process's timings (runs in the fresh process)."""
    import torch

    from bench.spare_interference_probe import time_tiny_relu, tiny_relu_inputs
    from eval_server.checks.runtime import profile_device_activity
    from eval_server.pipeline.timing import l2_flush_buffer

    device = torch.device("cuda", 0)
    torch.ones(1, device=device)
    sets = tiny_relu_inputs(device)
    if mode == "cupti":
        profile_device_activity(lambda: None, device)  # the spare's preparation
        profile_device_activity(lambda: torch.relu(sets[0][0]), device)  # the first correctness call
    flush = l2_flush_buffer(device)
    out = []
    for _ in range(timings):
        stats = time_tiny_relu(sets, flush, device)
        out.append(
            {
                "tail_us": (stats.escape_tail_ms or 0.0) * stats.calls_per_trial * 1e3,
                "launch_us": (stats.escape_launch_ms or 0.0) * stats.calls_per_trial * 1e3,
                "escaped": bool(stats.escaped_ms),
                "median_us": stats.median_ms * 1e3,
            }
        )
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: processes, timings, escaped timings, processes with an escaped timing, and the
    median and max tail excess over all timings."""
    rows = {}
    for mode in MODES:
        procs = [r["timings"] for r in runs if r["mode"] == mode]
        timings = [t for p in procs for t in p]
        if not timings:
            continue
        tails = [t["tail_us"] for t in timings]
        rows[mode] = {
            "processes": len(procs),
            "timings": len(timings),
            "escaped": sum(t["escaped"] for t in timings),
            "processes_escaped": sum(any(t["escaped"] for t in p) for p in procs),
            "tail_us_median": round(statistics.median(tails), 1),
            "tail_us_max": round(max(tails), 1),
            "per_process_tail_us_median": [
                round(statistics.median(t["tail_us"] for t in p), 1) for p in procs
            ],
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=12, help="fresh processes per mode")
    ap.add_argument("--timings", type=int, default=8, help="timings per process")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.timings)))
        return 0
    runs = []
    for i in range(args.processes * len(MODES)):
        mode = MODES[i % len(MODES)]
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--timings", str(args.timings)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        timings = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append({"mode": mode, "timings": timings})
        print(mode, [round(t["tail_us"], 1) for t in timings], flush=True)
    rows = summarize(runs)
    for mode, row in rows.items():
        print(mode, json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
