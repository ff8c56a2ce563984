"""Honest kernels under load: no false rejection while the host's cores and another GPU are busy.

Starts an eval server on `--devices`, then a load generator: one busy-looping process per CPU
core (`--cpu-load`, default all) and, with `--load-gpu N`, a process multiplying 8192x8192
matrices on GPU N without pause (training and generation beside the evaluator, as in a run).
It evaluates honest candidates round-robin until `--evals` results are in: the bundled samples'
correct kernels and, on a GPU, the KernelBench-sized bench corpus (bench/corpus.py). Every status
other than `ok` is a false rejection; the table names each with its check and feedback. The load
processes are this script's children, stopped by PID. Each result is printed as it arrives, and
`--max-seconds` stops sending new evaluations at a deadline (the summary then counts what came
back), so a run cut short still says what it measured.

    python bench/eval_under_load.py --devices 0 --load-gpu 1 --evals 200 --out under_load.json
    python bench/eval_under_load.py --devices cpu --evals 4 --cpu-load 1     # the plumbing, on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.eval_throughput import bench_jobs  # noqa: E402
from eval_server import samples  # noqa: E402
from eval_server.launch import running_server  # noqa: E402

GPU_LOAD = (
    "import torch\na = torch.randn(8192, 8192, device='cuda')\nwhile True:\n    a = (a @ a).clamp_(-1, 1)\n"
)


def honest_jobs(on_gpu: bool) -> list[tuple[str, str, str]]:
    """(name, reference, candidate) of every honest candidate this device can evaluate."""
    jobs = [
        (name, samples.load_problem(name.split("__")[0]), samples.load_candidate(name))
        for name in samples.candidate_names()
        if name.endswith("__correct")
    ]
    if on_gpu:
        jobs += [(j.name, j.problem.read_text(), j.candidate.read_text()) for j in bench_jobs([])]
    return jobs


def start_load(cpu: int, gpu: int | None) -> list[subprocess.Popen[bytes]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
        for _ in range(cpu)
    ]
    if gpu is not None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        procs.append(subprocess.Popen([sys.executable, "-c", GPU_LOAD], env=env, stdout=subprocess.DEVNULL))
    return procs


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="0", help="the eval server's --devices (cpu for the plumbing)")
    parser.add_argument("--load-gpu", type=int, default=None, help="GPU kept busy by the load generator")
    parser.add_argument("--cpu-load", type=int, default=os.cpu_count() or 1, help="busy processes (0: none)")
    parser.add_argument("--evals", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=None, help="send no evaluation after this")
    parser.add_argument("--server-args", default="", help="more flags for the eval server")
    parser.add_argument("--out", default=None, help="JSON summary here")
    args = parser.parse_args(argv)
    on_gpu = args.devices != "cpu"
    jobs = honest_jobs(on_gpu)
    server_args = ["--devices", args.devices, *args.server_args.split()]
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="under-load-") as tmp,
        running_server(Path(tmp), server_args) as url,
    ):
        load = start_load(args.cpu_load, args.load_gpu)
        t0 = time.monotonic()
        try:

            def one(i: int) -> dict | None:
                if args.max_seconds is not None and time.monotonic() - t0 > args.max_seconds:
                    return None
                name, reference, candidate = jobs[i % len(jobs)]
                body = {"reference": reference, "candidate": candidate, "problem_id": name}
                r = httpx.post(f"{url}/eval", json=body, timeout=900).json()
                return {
                    "case": name,
                    "status": r["status"],
                    "checks": [c["id"] for c in r["checks"] if c["severity"] == "reject"],
                    "speedup": r.get("speedup"),
                    "feedback": r["feedback"][:400] if r["status"] != "ok" else "",
                }

            with ThreadPoolExecutor(args.concurrency) as ex:
                for fut in as_completed([ex.submit(one, i) for i in range(args.evals)]):
                    row = fut.result()
                    if row is not None:
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            stop_load(load)
        wall = time.monotonic() - t0
    false = [r for r in rows if r["status"] != "ok"]
    summary = {
        "devices": args.devices,
        "load": {"cpu_processes": args.cpu_load, "gpu": args.load_gpu},
        "evaluations": len(rows),
        "false_rejections": len(false),
        "statuses": dict(Counter(r["status"] for r in rows)),
        "per_min": round(len(rows) / wall * 60, 2),
        "rejected": false,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rejected"}))
    for r in false:
        print(f"  {r['case']}: {r['status']} {r['checks']} {r['feedback'][:200]!r}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 1 if false else 0


if __name__ == "__main__":
    sys.exit(main())
