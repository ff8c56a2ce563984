"""Evaluator throughput on KernelBench-sized problems, against the common-practice baseline.

In one invocation:
1. starts our eval server on the chosen GPU(s) with a fresh reference-timing cache, and
   evaluates every bench case `--repeats` times (5 correctness trials + 100 timing trials
   each, the defaults): evaluations/min, p50/p95 latency, mean seconds per phase, and the
   first (cold: Triton compile, reference timed) vs later (warm) latency;
2. runs `bench/baseline_eval.py` as a fresh process per evaluation (inputs from get_inputs()
   on the CPU, the common practice) `--baseline-repeats` times per case, on the same GPU;
3. prints both and the throughput ratio; `--json` writes everything.

With `--kernelbench DIR` (a local checkout of ScalingIntelligence/KernelBench) the cases are
KernelBench's own problem files at their real sizes, read from DIR (KERNELBENCH_CASES: L1 19 ReLU,
23 Softmax, 47 Sum over a dimension, L2 12 Gemm_Multiply_LeakyReLU) with our Triton candidates,
and the comparison point is KernelBench's own harness (`bench/kernelbench_eval.py`: its
`eval_kernel_against_ref`, one fresh process per evaluation) instead of baseline_eval.py.

With `--backend cuda` the candidates are the `<problem>__cuda.py` files (KernelBench's CUDA format,
built with load_inline) sent with options.backend "cuda", and the comparison point runs KernelBench's
CUDA backend (or baseline_eval.py) with one build directory for the whole run. Our side then runs in
two waves: repeat 0 of every case (cold: the extension is built, the reference timed) and, once it
is done, the other repeats (cached: the build cache and the reference-timing cache hit); each wave
reports its own evaluations/min, p50 and mean phases (`compile` included).

  python bench/eval_throughput.py --devices 0 --repeats 3 --baseline-repeats 1 --json out.json
  python bench/eval_throughput.py --kernelbench third_party/KernelBench --repeats 3 --baseline-repeats 1
  python bench/eval_throughput.py --kernelbench third_party/KernelBench --backend cuda --repeats 3 --baseline-repeats 2
  python bench/eval_throughput.py --kernelbench third_party/KernelBench --repeats 3 --baseline-repeats 0 \
      --server-args '' --server-args '--timing-ci 0.002'    # A/B of server flags in one run

With `--fresh N` every request is a never-seen candidate (bench/fresh.py: unique kernel names, so
no cache serves a compile), as in an RL step: the bundled samples' status mix, or with
`--kernelbench` its problems with every third kernel broken (a compile error); one warm-up
evaluation per problem first (its reference timed once), then N requests `--in-flight` at a time.
It reports evaluations/min, client latency p50/p90, statuses, phase means, the GPU-exclusive
seconds per evaluation, and what bounds the rate: the workers' busy share and the seconds in the
worker by status; exit 1 when a status differs from the one the case must get.

  python bench/eval_throughput.py --fresh 64 --in-flight 12 --devices 0
  python bench/eval_throughput.py --fresh 64 --in-flight 12 --kernelbench third_party/KernelBench --devices 0
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import BENCH_CASES  # noqa: E402
from bench.fresh import FreshRequest, fresh_requests  # noqa: E402
from eval_server.launch import running_server  # noqa: E402
from eval_server.schema import BACKENDS  # noqa: E402
from krl_common.stats import percentile  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
# the judge's sections that hold the GPU alone (eval_server/judge/evaluate.py: ctx.gpu(exclusive=True));
# the hand-over is inside the reference's timing when the judge times the reference, on its own
# when the worker knew the reference's timing (judge/known.py)
FRESH_EXCLUSIVE_PHASES = ("judge_reference_timing", "judge_timing")


def gpu_exclusive_s(phases: dict[str, float]) -> float:
    """Seconds one evaluation held the GPU exclusively: its judge's hold of the lock, or (an
    evaluator without the hold phases) its judge's exclusive phases, lock waits included."""
    if "judge_gpu_held_exclusive" in phases:
        return phases["judge_gpu_held_exclusive"]
    alone = 0.0 if "judge_reference_timing" in phases else phases.get("judge_handover", 0.0)
    return alone + sum(phases.get(k, 0.0) for k in FRESH_EXCLUSIVE_PHASES)


def gpu_shared_s(phases: dict[str, float]) -> float:
    """Seconds one evaluation held the GPU lock shared (judge and runner): what exclusive
    sections of the GPU's other evaluations wait behind."""
    return phases.get("judge_gpu_held_shared", 0.0) + phases.get("gpu_held_shared", 0.0)


# KernelBench problems (level, number) and the bench problem whose candidates
# (bench/candidates/<problem>__<backend>.py) solve each.
KERNELBENCH_CASES: tuple[tuple[int, int, str], ...] = (
    (1, 19, "relu_large"),  # ReLU, 4096 x 393216
    (1, 23, "softmax_large"),  # Softmax over dim 1, 4096 x 393216
    (1, 47, "sum_dim_large"),  # Sum over dim 1, 128 x 4096 x 4095
    (2, 12, "gemm_scale_leakyrelu_large"),  # Gemm_Multiply_LeakyReLU, 1024 x 8192 x 8192
)


def candidate_path(problem: str, backend: str) -> Path:
    """bench/candidates/<problem>__<backend>.py; SystemExit naming the file when there is none."""
    path = BENCH_DIR / "candidates" / f"{problem}__{backend}.py"
    if not path.is_file():
        raise SystemExit(f"no {backend} candidate for {problem}: {path} does not exist (pick --cases)")
    return path


@dataclass(frozen=True)
class Job:
    """One benchmark case: a problem file and a candidate file."""

    name: str
    problem: Path
    candidate: Path


def brief(feedback: str, head: int = 300, tail: int = 600) -> str:
    """A failed row's feedback: its start says what failed, its end (an exception's last line) why."""
    if len(feedback) <= head + tail:
        return feedback
    return f"{feedback[:head]} [...] {feedback[-tail:]}"


def _known(names: list[str], known: set[str]) -> None:
    """Exit naming a `--cases` entry that matches no case (an empty selection is no benchmark)."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def bench_jobs(names: list[str], backend: str = "triton") -> list[Job]:
    """The cases of bench/corpus.py (all when `names` is empty)."""
    _known(names, {c.problem for c in BENCH_CASES})
    return [
        Job(
            c.problem,
            BENCH_DIR / "problems" / f"{c.problem}.py",
            BENCH_DIR / "candidates" / f"{c.candidate}.py"
            if backend == "triton"
            else candidate_path(c.problem, backend),
        )
        for c in BENCH_CASES
        if not names or c.problem in names
    ]


def kernelbench_jobs(root: Path, names: list[str], backend: str = "triton") -> list[Job]:
    """KERNELBENCH_CASES found in a KernelBench checkout (`KernelBench/level<L>/<N>_*.py`)."""
    jobs, known = [], set()
    for level, number, problem in KERNELBENCH_CASES:
        found = sorted((root / "KernelBench" / f"level{level}").glob(f"{number}_*.py"))
        if len(found) != 1:
            raise SystemExit(
                f"expected one KernelBench/level{level}/{number}_*.py under {root}, found {len(found)}"
            )
        name = f"L{level}_{found[0].stem}"
        aliases = {name, found[0].stem, problem}  # e.g. L1_19_ReLU, 19_ReLU or relu_large
        known |= aliases
        if not names or aliases & set(names):
            jobs.append(Job(name, found[0], candidate_path(problem, backend)))
    _known(names, known)
    return jobs


def _phase_means(rows: list[dict]) -> dict[str, float]:
    phases: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["phases"].items():
            phases.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in sorted(phases.items())}


def _wave_summary(rows: list[dict], wall: float) -> dict:
    """Rate, in-worker p50 and phase means of one wave of evaluations."""
    return {
        "evaluations": len(rows),
        "wall_s": wall,
        "evals_per_min": 60 * len(rows) / wall,
        "p50_s": percentile([r["elapsed_in_worker_s"] for r in rows], 0.5),
        "phase_mean_s": _phase_means(rows),
    }


def _server_args(
    devices: str, workers_per_device: int, tmp: Path, timeout_s: float, extra: Sequence[str]
) -> list[str]:
    """The eval server's flags of one benchmark configuration (a fresh reference cache in `tmp`)."""
    return ["--devices", devices, "--workers-per-device", str(workers_per_device),
            "--ref-cache", str(tmp / "ref_cache.sqlite"), "--timeout-s", str(timeout_s), *extra]  # fmt: skip


def run_ours(
    devices: str,
    workers_per_device: int,
    repeats: int,
    cases: list[Job],
    tmp: Path,
    timeout_s: float,
    backend: str = "triton",
    server_args: Sequence[str] = (),
) -> dict:
    """Every case `repeats` times; up to 2 requests per worker in flight so the queue never runs dry.
    Repeat 0 of every case runs first (cold wave: reference measured, kernels compiled), then the
    rest (cached wave: a training run's steady state, where every problem has been seen).
    `server_args`: further eval-server flags (one configuration of an A/B comparison)."""
    rows: list[dict] = []
    args = _server_args(devices, workers_per_device, tmp, timeout_s, server_args)
    jobs = [(rep, case) for rep in range(repeats) for case in cases]
    waves = [jobs[: len(cases)], jobs[len(cases) :]] if repeats > 1 else [jobs]
    wave_walls: list[float] = []
    n_workers = workers_per_device * len(devices.split(","))
    # one client for every request: a new one per request costs ~20 ms (TLS context) inside the figures
    with running_server(tmp, args) as url, httpx.Client(timeout=timeout_s + 600) as client:
        t0 = time.perf_counter()

        def one(job: tuple[int, object]) -> None:
            rep, case = job
            body = {
                "reference": case.problem.read_text(encoding="utf-8"),
                "candidate": case.candidate.read_text(encoding="utf-8"),
                "problem_id": case.name,
            }
            if backend != "triton":
                body["options"] = {"backend": backend}
            t = time.perf_counter()
            res = client.post(f"{url}/eval", json=body).json()
            latency = time.perf_counter() - t
            rows.append(
                {
                    "case": case.name,
                    "repeat": rep,
                    "latency_s": latency,
                    "status": res["status"],
                    "speedup": res["speedup"],
                    "phases": res["phases"],
                    "reference_timing_source": res.get("reference_timing_source"),
                    "checks": [c["id"] for c in res["checks"]],
                    "feedback": brief(res["feedback"]) if res["status"] != "ok" else "",
                    "error": res.get("error") if res["status"] == "server_error" else None,
                    "elapsed_in_worker_s": res["elapsed_s"],
                    "warmup_ms": {
                        side: (res.get(f"{side}_timing") or {}).get("warmup_ms")
                        for side in ("reference", "candidate")
                    },
                    "trials": {
                        side: (res.get(f"{side}_timing") or {}).get("trials")
                        for side in ("reference", "candidate")
                    },
                }
            )
            print(
                f"ours  {case.name:28s} rep {rep}  {res['status']:14s} {latency:6.2f} s "
                f"(in worker {res['elapsed_s']:.2f} s, queued {res['phases'].get('queue_wait', 0.0):.2f} s)  "
                f"speedup {res['speedup'] if res['speedup'] is None else round(res['speedup'], 3)}  "
                f"{res.get('reference_timing_source') or ''}",
                flush=True,
            )
            if res["status"] == "server_error":
                print(f"      {res['feedback'][-300:]!r} at {failed_at(res)}", flush=True)

        with ThreadPoolExecutor(max_workers=2 * n_workers) as ex:
            for wave in waves:
                t_wave = time.perf_counter()
                list(ex.map(one, wave))
                wave_walls.append(time.perf_counter() - t_wave)
        wall = time.perf_counter() - t0
    # Latency of one evaluation = time in the worker (queueing behind the other request excluded).
    lat = [r["elapsed_in_worker_s"] for r in rows]
    warm = [r["elapsed_in_worker_s"] for r in rows if r["repeat"] > 0]
    result = {
        **_wave_summary(rows, wall),
        "p95_s": percentile(lat, 0.95),
        "warm_p50_s": percentile(warm, 0.5) if warm else None,
        "cold_mean_s": statistics.fmean(r["elapsed_in_worker_s"] for r in rows if r["repeat"] == 0),
        "rows": rows,
    }
    if len(waves) > 1:
        result["waves"] = {
            name: _wave_summary([r for r in rows if (r["repeat"] > 0) == cached], w)
            for name, cached, w in zip(("cold", "cached"), (False, True), wave_walls, strict=True)
            if any((r["repeat"] > 0) == cached for r in rows)
        }
    return result


def run_baseline(
    device: str,
    repeats: int,
    cases: list[Job],
    timeout_s: float,
    kernelbench: Path | None = None,
    backend: str = "triton",
    build_dir: Path | None = None,
) -> dict:
    """Each case in a fresh process: baseline_eval.py, or KernelBench's harness from `kernelbench`.
    Backend cuda: every process builds into `build_dir` (repeat 0 builds, later repeats reuse)."""
    rows = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
    cuda_args: list[str] = []
    if backend == "cuda" and build_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(build_dir)  # baseline_eval.py: load_inline's default root
        cuda_args = ["--backend", "cuda", "--build-dir", str(build_dir)]
    t0 = time.perf_counter()
    for rep in range(repeats):
        for case in cases:
            files = ["--problem", str(case.problem), "--candidate", str(case.candidate)]
            if kernelbench is None:
                cmd = [sys.executable, str(BENCH_DIR / "baseline_eval.py"), *files]
            else:
                cmd = [
                    sys.executable,
                    str(BENCH_DIR / "kernelbench_eval.py"),
                    "--kernelbench",
                    str(kernelbench),
                    *files,
                    *cuda_args,
                ]
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            latency = time.perf_counter() - t
            try:
                out = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out = {"error": proc.stderr[-800:]}
            rows.append({"case": case.name, "repeat": rep, "latency_s": latency, **out})
            print(f"base  {case.name:28s} rep {rep}  {latency:6.2f} s  {json.dumps(out)[:160]}", flush=True)
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


def run_fresh(
    devices: str,
    workers_per_device: int,
    requests: list[FreshRequest],
    warmups: list[FreshRequest],
    tmp: Path,
    timeout_s: float,
    in_flight: int,
    server_args: Sequence[str] = (),
) -> dict:
    """Never-seen candidates (bench/fresh.py), `in_flight` at a time, after one evaluation per
    problem (`warmups`: its reference timed once, as an RL run times it once per problem and GPU).
    GPU-exclusive seconds: the judge's timed sections (reference and candidate timing)."""
    args = _server_args(devices, workers_per_device, tmp, timeout_s, server_args)
    rows: list[dict] = []
    with running_server(tmp, args) as url, httpx.Client(timeout=timeout_s + 600) as client:
        workers = int(client.get(f"{url}/stats").json()["workers"])

        def one(req: FreshRequest) -> dict:
            body: dict = {
                "reference": req.problem_source,
                "candidate": req.candidate_source,
                "problem_id": req.name,
            }
            if req.timeout_s is not None:
                body["options"] = {"timeout_s": req.timeout_s}
            t = time.perf_counter()
            res = client.post(f"{url}/eval", json=body).json()
            phases = res["phases"]
            return {
                "case": req.name,
                "expected": req.expected_status,
                "status": res["status"],
                "latency_s": time.perf_counter() - t,
                "elapsed_in_worker_s": res["elapsed_s"],
                "gpu_exclusive_s": gpu_exclusive_s(phases),
                "gpu_shared_s": gpu_shared_s(phases),
                "phases": phases,
                "checks": [c["id"] for c in res["checks"]],
                "feedback": brief(res["feedback"]) if res["status"] != req.expected_status else "",
                "error": res.get("error") if res["status"] == "server_error" else None,
            }

        with ThreadPoolExecutor(max_workers=in_flight) as ex:
            list(ex.map(one, warmups))
            t0 = time.perf_counter()
            for row in ex.map(one, requests):
                rows.append(row)
                print(
                    f"fresh {row['case']:36s} {row['status']:14s} (expected {row['expected']}) "
                    f"{row['latency_s']:6.2f} s, GPU-exclusive {row['gpu_exclusive_s']:.2f} s",
                    flush=True,
                )
            wall = time.perf_counter() - t0
    latency = [r["latency_s"] for r in rows]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        **_wave_summary(rows, wall),
        **worker_load(rows, wall, workers),
        "in_flight": in_flight,
        "latency_p50_s": percentile(latency, 0.5),
        "latency_p90_s": percentile(latency, 0.9),
        "gpu_exclusive_mean_s": statistics.fmean(r["gpu_exclusive_s"] for r in rows),
        "gpu_shared_mean_s": statistics.fmean(r["gpu_shared_s"] for r in rows),
        "statuses": dict(sorted(statuses.items())),
        "unexpected": [r for r in rows if r["status"] != r["expected"]],
        "rows": rows,
    }


def worker_load(rows: list[dict], wall: float, workers: int) -> dict:
    """What bounds a wave: the share of the workers' time spent in evaluations (near 1: more or
    faster workers, not more requests in flight, raise the rate) and where it went, the mean and
    total in-worker seconds by status (a timeout costs its whole limit)."""
    by_status: dict[str, list[float]] = {}
    for r in rows:
        by_status.setdefault(r["status"], []).append(r["elapsed_in_worker_s"])
    busy = sum(r["elapsed_in_worker_s"] for r in rows)
    return {
        "workers_busy": busy / (workers * wall) if wall > 0 and workers > 0 else None,
        "in_worker_s_by_status": {
            k: {"n": len(v), "mean": statistics.fmean(v), "total": sum(v)} for k, v in sorted(by_status.items())
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="0", help="GPU id(s) for our server; the baseline uses the first")
    p.add_argument("--workers-per-device", default="1", help="comma-separated: run our server once per value")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline-repeats", type=int, default=1)
    p.add_argument("--cases", default="", help="comma-separated problem names (default: all)")
    p.add_argument(
        "--kernelbench",
        type=Path,
        help="KernelBench checkout: run its problems and compare with its own harness (module docstring)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="triton",
        help="candidates <problem>__<backend>.py; cuda: options.backend cuda, cold and cached waves",
    )
    p.add_argument(
        "--server-args",
        action="append",
        default=None,
        help="further eval-server flags, one configuration per use (A/B in one run), e.g. "
        "--server-args '' --server-args '--timing-ci 0.002' (a lone flag: --server-args=--compile-unlocked); "
        "default: one configuration, none",
    )
    p.add_argument(
        "--fresh",
        type=int,
        default=0,
        metavar="N",
        help="N never-seen candidates (bench/fresh.py): the bundled samples' mix, or with --kernelbench its "
        "problems with every third kernel broken; no baseline",
    )
    p.add_argument("--in-flight", type=int, default=0, help="--fresh: requests in flight (0: 2 per worker)")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.fresh and args.backend != "triton":
        p.error("--fresh renames Triton kernels: --backend triton only")
    args.server_args = args.server_args or [""]
    return args


def main_fresh(args: argparse.Namespace, names: list[str]) -> int:
    jobs = None
    if args.kernelbench:
        jobs = [(j.name, j.problem, j.candidate) for j in kernelbench_jobs(args.kernelbench, names)]
    tag = f"{os.getpid()}_{int(time.time())}"
    requests = fresh_requests(jobs, args.fresh, tag)
    first: dict[str, FreshRequest] = {}
    for r in fresh_requests(jobs, len(jobs) if jobs else args.fresh, f"{tag}_warm"):
        if r.expected_status == "ok":
            first.setdefault(r.problem_source, r)
    results = {}
    for wpd in [int(w) for w in args.workers_per_device.split(",")]:
        n_workers = wpd * len(args.devices.split(","))
        in_flight = args.in_flight or 2 * n_workers
        for extra in args.server_args:
            name = f"fresh_{wpd}_per_gpu_{in_flight}_in_flight" + (f" [{extra}]" if extra else "")
            with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
                r = run_fresh(args.devices, wpd, requests, list(first.values()), Path(tmp), args.timeout_s,
                              in_flight, shlex.split(extra))  # fmt: skip
            results[name] = r
            print(
                f"{name}: {r['evaluations']} evaluations in {r['wall_s']:.1f} s = {r['evals_per_min']:.1f}/min, "
                f"latency p50 {r['latency_p50_s']:.2f} s p90 {r['latency_p90_s']:.2f} s, in-worker p50 "
                f"{r['p50_s']:.2f} s, GPU-exclusive {r['gpu_exclusive_mean_s']:.3f} s per evaluation "
                f"(lock held shared {r['gpu_shared_mean_s']:.3f} s)"
            )
            print(f"{name} statuses:", json.dumps(r["statuses"]))
            per_status = {k: f"{v['n']} x {v['mean']:.2f} s" for k, v in r["in_worker_s_by_status"].items()}
            print(f"{name} workers busy {r['workers_busy']:.0%}; in the worker by status:", json.dumps(per_status))
            print(
                f"{name} phase means (s):", json.dumps({k: round(v, 3) for k, v in r["phase_mean_s"].items()})
            )
            for row in r["unexpected"]:
                print(
                    f"  UNEXPECTED {row['case']}: {row['status']} (expected {row['expected']}): {row['feedback']}"
                )
                where = failed_at(row)
                if where:
                    print(f"    where: {where}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r["unexpected"] for r in results.values()) else 0


def failed_at(row: dict[str, Any]) -> str:
    """The innermost frames of a server_error's traceback (where the evaluator failed), or ''."""
    tb = (row.get("error") or {}).get("traceback") or ""
    frames = [line.strip() for line in tb.splitlines() if line.strip().startswith('File "')]
    return " <- ".join(reversed(frames[-3:]))


def main() -> int:
    args = parse_args()
    names = [n for n in args.cases.split(",") if n]
    if args.fresh:
        return main_fresh(args, names)
    cases = (
        kernelbench_jobs(args.kernelbench, names, args.backend)
        if args.kernelbench
        else bench_jobs(names, args.backend)
    )
    results: dict[str, dict | None] = {}
    for wpd in [int(w) for w in args.workers_per_device.split(",")]:
        for extra in args.server_args:
            name = f"ours_{wpd}_per_gpu" + (f" [{extra}]" if extra else "")
            with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
                results[name] = run_ours(
                    args.devices, wpd, args.repeats, cases, Path(tmp), args.timeout_s, args.backend,
                    shlex.split(extra),
                )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-throughput-builds-") as builds:
        base = (
            run_baseline(
                args.devices.split(",")[0],
                args.baseline_repeats,
                cases,
                args.timeout_s,
                args.kernelbench,
                args.backend,
                Path(builds),
            )
            if args.baseline_repeats
            else None
        )
    base_name = "kernelbench_harness" if args.kernelbench else "baseline"
    results[base_name] = base
    print()
    print(f"{'':20s} {'evals':>6s} {'wall s':>8s} {'evals/min':>10s} {'p50 s':>7s} {'p95 s':>7s}")
    for name, r in results.items():
        if r:
            print(
                f"{name:20s} {r['evaluations']:6d} {r['wall_s']:8.1f} {r['evals_per_min']:10.2f} {r['p50_s']:7.2f} {r['p95_s']:7.2f}"
            )
            for wave, w in r.get("waves", {}).items():
                print(
                    f"  {wave + ' wave':18s} {w['evaluations']:6d} {w['wall_s']:8.1f} {w['evals_per_min']:10.2f} {w['p50_s']:7.2f}"
                )
    for name, r in results.items():
        if r and name != base_name:
            if base:
                print(
                    f"{name}/{base_name}: throughput {r['evals_per_min'] / base['evals_per_min']:.1f}x, "
                    f"p50 latency {base['p50_s'] / r['p50_s']:.1f}x lower"
                )
            print(f"{name}: warm p50 {r['warm_p50_s']}, cold mean {r['cold_mean_s']:.2f} s")
            for side in ("reference", "candidate"):
                wu = [row["warmup_ms"][side] for row in r["rows"] if row["warmup_ms"][side] is not None]
                if wu:
                    print(f"{name}: {side} warm-up mean {statistics.fmean(wu):.1f} ms over {len(wu)} timings")
            print(
                f"{name} phase means (s):", json.dumps({k: round(v, 3) for k, v in r["phase_mean_s"].items()})
            )
            for wave, w in r.get("waves", {}).items():
                print(
                    f"{name} {wave} wave phase means (s):",
                    json.dumps({k: round(v, 3) for k, v in w["phase_mean_s"].items()}),
                )
            for case in cases:
                for label, warm_rows in (("cold", False), ("warm", True)):
                    rows = [
                        row
                        for row in r["rows"]
                        if row["case"] == case.name and (row["repeat"] > 0) == warm_rows
                    ]
                    if rows and (warm_rows or "waves" in r):
                        means = {k: round(v, 3) for k, v in _phase_means(rows).items()}
                        print(f"  {case.name} {label} phases (s):", json.dumps(means))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    bad = [
        row
        for name, r in results.items()
        if r and name != base_name
        for row in r["rows"]
        if row["status"] != "ok"
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
