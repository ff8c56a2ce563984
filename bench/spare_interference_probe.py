"""Does the worker's spare child, preparing for the next evaluation, disturb the running
evaluation's timing of a tiny kernel? (GPU tests saw legitimate ~2 us kernels rejected by
`runtime.escaped_timing` in all three timings of one evaluation, now and then.)

This process times a 64x1000 ReLU the way the evaluator does (`time_gpu`, 32 calls per trial,
adaptive trials, the GPU lock held exclusive, a short gap between timings), while an
interferer process forks children in a loop that each prepare like the spare
(`child_prep`: the CUDA context, then the first kernels), idle a moment and exit. Each child
reports when its context was up and when its kernels ran; every timing is classified by what
overlapped it (context creation, first kernels, exit, nothing) and the share of timings that
saw escaped work is printed per class. Modes: `none` (no interferer), `prep` (as the worker
prepares: nothing locked), `prep_locked` (the first kernels under the GPU lock's shared mode).

  python3 bench/spare_interference_probe.py --seconds 25 --json probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOLD_S = 0.3  # a prepared child idles this long before it exits (a spare waiting for its request)
GAP_S = 0.2  # between one child's exit and the next fork
TIMING_GAP_S = 0.05  # between two timings, outside the lock (an evaluation's other phases)


def interfere(mode: str, lock_path: str, events_path: str, seconds: float) -> None:
    """Fork preparing children until `seconds` have passed; one JSON line per child."""
    import torch

    from eval_server.isolation.gpu_lock import GpuLock
    from eval_server.pipeline import evaluate as _evaluate  # noqa: F401 - imported before forking, as the worker does
    from eval_server.workers import child_prep

    deadline = time.monotonic() + seconds
    with open(events_path, "w") as events:
        while time.monotonic() < deadline:
            read_fd, write_fd = os.pipe()
            forked = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: prepare, report, idle, exit
                os.close(read_fd)
                try:
                    device = torch.device("cuda", 0)
                    child_prep.create_context(device)
                    ctx_done = time.monotonic()
                    lock = GpuLock(lock_path) if mode == "prep_locked" else None
                    with lock.shared() if lock is not None else contextlib.nullcontext():
                        kernels_start = time.monotonic()
                        child_prep.launch_first_kernels(device)
                        kernels_done = time.monotonic()
                    os.write(write_fd, json.dumps([ctx_done, kernels_start, kernels_done]).encode())
                    os.close(write_fd)  # the parent's EOF: HOLD_S before this child exits
                    time.sleep(HOLD_S)
                finally:
                    os._exit(0)
            os.close(write_fd)
            raw = b""
            while chunk := os.read(read_fd, 4096):
                raw += chunk
            eof = time.monotonic()  # the child wrote its times; it idles HOLD_S, then exits
            os.waitpid(pid, 0)
            reaped = time.monotonic()
            os.close(read_fd)
            times = json.loads(raw) if raw else [None, None, None]
            record = {"forked": forked, "ctx_done": times[0], "kernels_start": times[1],
                      "kernels_done": times[2], "exit_start": eof + HOLD_S, "reaped": reaped}  # fmt: skip
            events.write(json.dumps(record) + "\n")
            events.flush()
            time.sleep(GAP_S)


def _overlaps(a0: float, a1: float, b0: float | None, b1: float | None) -> bool:
    return b0 is not None and b1 is not None and a0 < b1 and b0 < a1


def classify(timing: dict[str, Any], children: list[dict[str, Any]]) -> str:
    """What of the children's life overlapped this timing: the first match of ctx, kernels, exit."""
    t0, t1 = timing["start"], timing["end"]
    for name, key0, key1 in (("ctx", "forked", "ctx_done"), ("kernels", "kernels_start", "kernels_done"),
                             ("exit", "exit_start", "reaped")):  # fmt: skip
        if any(_overlaps(t0, t1, c[key0], c[key1]) for c in children):
            return name
    return "quiet"


def tiny_relu_inputs(device: Any) -> list[list[Any]]:
    """Three input sets of the 64x1000 ReLU (~2 us), as the evaluator rotates them."""
    import torch

    return [[torch.randn(64, 1000, device=device)] for _ in range(3)]


def time_tiny_relu(sets: list[list[Any]], flush: Any, device: Any) -> Any:
    """One timing of the ReLU as the evaluator times a short problem: 32 calls per trial,
    adaptive 20-99 trials, settled warm-up (the TimingStats)."""
    import torch

    from eval_server.pipeline.timing import time_gpu

    return time_gpu(
        torch.relu, sets, trials=100, warmup=3, device=device, flush=flush, calls_per_trial=32,
        min_trials=20, ci_rel=1e-3, min_warmup_ms=20.0, max_warmup_ms=200.0,
    )  # fmt: skip


def time_while(seconds: float, lock_path: str) -> list[dict[str, Any]]:
    """Time the tiny ReLU back to back (with a gap) for `seconds`, the lock held exclusive."""
    import torch

    from eval_server.isolation.gpu_lock import GpuLock
    from eval_server.pipeline.timing import l2_flush_buffer

    device = torch.device("cuda", 0)
    sets = tiny_relu_inputs(device)
    flush = l2_flush_buffer(device)
    lock = GpuLock(lock_path)
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.monotonic()
        with lock.exclusive():
            stats = time_tiny_relu(sets, flush, device)
        out.append({"start": start, "end": time.monotonic(), "escaped_us": stats.escaped_ms * 1e3,
                    "median_us": stats.median_ms * 1e3, "trials": stats.trials})  # fmt: skip
        time.sleep(TIMING_GAP_S)
    return out


def summarize(timings: list[dict[str, Any]]) -> dict[str, Any]:
    if not timings:
        return {"n": 0}
    escaped = [t["escaped_us"] for t in timings if t["escaped_us"] > 0]
    medians = [t["median_us"] for t in timings]
    return {
        "n": len(timings),
        "escaped": len(escaped),
        "escaped_share": round(len(escaped) / len(timings), 3),
        "escaped_us_median": round(statistics.median(escaped), 4) if escaped else 0.0,
        "median_us": round(statistics.median(medians), 4),
        "median_cv_pct": round(100 * statistics.pstdev(medians) / statistics.fmean(medians), 2),
    }


def run_mode(mode: str, seconds: float, workdir: Path) -> dict[str, Any]:
    lock_path, events_path = str(workdir / "gpu.lock"), str(workdir / f"{mode}.events")
    proc = None
    if mode != "none":
        cmd = [sys.executable, __file__, "--interferer", mode, "--lock", lock_path, "--events", events_path,
               "--seconds", str(seconds + 5)]  # fmt: skip
        proc = subprocess.Popen(cmd)
        time.sleep(4.0)  # its torch import; the first children are forking
    timings = time_while(seconds, lock_path)
    children: list[dict[str, Any]] = []
    if proc is not None:
        proc.wait(timeout=120)
        children = [json.loads(line) for line in Path(events_path).read_text().splitlines() if line.strip()]
    by_class: dict[str, list[dict[str, Any]]] = {}
    for t in timings:
        by_class.setdefault(classify(t, children), []).append(t)
    prep_s = [c["kernels_done"] - c["forked"] for c in children if c["kernels_done"] is not None]
    return {
        "mode": mode,
        "children": len(children),
        "child_prep_s_median": round(statistics.median(prep_s), 3) if prep_s else None,
        "all": summarize(timings),
        "by_overlap": {k: summarize(v) for k, v in sorted(by_class.items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=25.0, help="timing time per mode")
    parser.add_argument("--modes", default="none,prep,prep_locked")
    parser.add_argument("--json", default=None)
    parser.add_argument("--interferer", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lock", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--events", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interferer:
        interfere(args.interferer, args.lock, args.events, args.seconds)
        return 0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            result = run_mode(mode, args.seconds, Path(tmp))
            results.append(result)
            print(json.dumps(result), flush=True)
    print(
        f"{'mode':12} {'overlap':8} {'n':>4} {'escaped':>8} {'share':>6} {'esc us':>7} {'med us':>7} {'cv %':>5}"
    )
    for r in results:
        for name, s in [("all", r["all"]), *r["by_overlap"].items()]:
            if s.get("n"):
                print(f"{r['mode']:12} {name:8} {s['n']:>4} {s['escaped']:>8} {s['escaped_share']:>6} "
                      f"{s['escaped_us_median']:>7} {s['median_us']:>7} {s['median_cv_pct']:>5}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
