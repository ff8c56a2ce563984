"""Where a client's latency goes outside the evaluation itself.

Starts one eval server with one worker and evaluates the bundled relu sample (`relu` /
`relu__correct`) `--repeats` times, first one request at a time, then with `--in-flight`
requests outstanding (as bench/eval_throughput.py sends: 2 per worker). For each mode it prints
evaluations/min and the means of: the client's latency, the result's `elapsed_s` (in the
worker), `phases.queue_wait` (waiting for an idle worker in the server), what remains of the
latency (HTTP, JSON, pool, pipes), `phases.spare_wait` (the request waiting for the prepared
child) and `phases.child_exit` (the child's exit after its result was complete), plus the share
of the wall time the worker spent evaluating.

  python bench/eval_latency.py --repeats 20                  # CPU (Triton interpreter)
  python bench/eval_latency.py --devices 0 --repeats 20      # one GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval_server import samples  # noqa: E402
from eval_server.launch import running_server  # noqa: E402


def run_mode(url: str, body: dict, repeats: int, in_flight: int) -> dict[str, float]:
    """`repeats` evaluations with `in_flight` requests outstanding; means of the latency parts."""
    rows: list[dict[str, float]] = []

    def one(_: int) -> None:
        t = time.perf_counter()
        res = client.post(f"{url}/eval", json=body).json()
        latency = time.perf_counter() - t
        assert res["status"] == "ok", res["feedback"]
        ph = res["phases"]
        rows.append(
            {
                "latency": latency,
                "in_worker": res["elapsed_s"],
                "queue_wait": ph["queue_wait"],
                "outside": latency - res["elapsed_s"] - ph["queue_wait"],
                "spare_wait": ph.get("spare_wait", 0.0),
                "child_exit": ph.get("child_exit", 0.0),
            }
        )

    # one client (thread-safe) for the run: a new one per request costs ~20 ms inside the figures
    with httpx.Client(timeout=600) as client:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=in_flight) as ex:
            list(ex.map(one, range(repeats)))
        wall = time.perf_counter() - t0
    out = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    out["evals_per_min"] = 60 * len(rows) / wall
    out["worker_busy"] = sum(r["in_worker"] for r in rows) / wall
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="cpu", help="'cpu' or one GPU id")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--in-flight", type=int, default=2, help="outstanding requests of the second mode")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    body = {"reference": samples.load_problem("relu"), "candidate": samples.load_candidate("relu__correct")}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        # a fresh reference cache (never the user's), as bench/eval_throughput.py
        server_args = ["--devices", args.devices, "--ref-cache", str(Path(tmp) / "ref_cache.sqlite")]
        server_args += ["--cpu-workers", "1"] if args.devices == "cpu" else ["--workers-per-device", "1"]
        with running_server(Path(tmp), server_args) as url:
            run_mode(url, body, 2, 1)  # warm-up: Triton compile, reference timing cache
            for in_flight in (1, args.in_flight):
                r = results[f"in_flight_{in_flight}"] = run_mode(url, body, args.repeats, in_flight)
                print(
                    f"in flight {in_flight}: {r['evals_per_min']:.1f} evals/min, worker busy {r['worker_busy']:.0%}; "
                    "mean s: "
                    + ", ".join(
                        f"{k} {r[k]:.4f}"
                        for k in ("latency", "in_worker", "queue_wait", "outside", "spare_wait", "child_exit")
                    ),
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
