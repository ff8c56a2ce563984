"""A/A noise of the evaluator: the same correct kernel evaluated again and again, spread over minutes.

RL reinforces noise as if it were a gain (FIELD_NOTES), so the spread of the reported speedup
for an unchanged kernel is the floor under any real improvement. This runs the production path,
a worker pool as the server runs it (one worker, fresh process per evaluation, the reference
cache starting empty as after a first start, default options), over a ladder of kernel sizes
from a few microseconds up (bench/problems resized, their bench/candidates solutions). Each
round evaluates every case once and then waits `--pause-s`; before round `--restart-at` the
worker is restarted, and before round `--crash-at` a crashing candidate (samples relu__segfault)
is evaluated, so the next evaluations run right after both. Per case it prints the speedup's
mean, CV, min and max, the speedups right after the restart and the crash, and the timing
method used; it exits 1 when a case's speedup CV is above `--max-cv`, an evaluation is not
`ok`, or a case was timed by more than one method, and 2 when nothing was timed (CPU workers
check correctness in Triton's interpreter and report no timing).

  python bench/timing_noise.py --devices 0 --repeats 10 --pause-s 20 --json noise.json
  python bench/timing_noise.py --devices cpu --repeats 2 --pause-s 0 --cases relu_large:64x1000
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import load_candidate, sized_problem  # noqa: E402
from eval_server import samples  # noqa: E402
from eval_server.__main__ import parse_slots  # noqa: E402
from eval_server.schema import STATUS_OK, EvalRequest, EvalResult  # noqa: E402
from eval_server.workers.pool import PoolConfig, WorkerPool  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_NO_TIMING = 0, 1, 2
ESCAPED_CHECK = "runtime.escaped_timing"


@dataclasses.dataclass(frozen=True)
class NoiseCase:
    """A bench problem at given sizes (empty: its full size) with its Triton candidate."""

    problem: str
    sizes: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.problem}:{'x'.join(str(v) for _, v in self.sizes) or 'full'}"

    def request(self) -> EvalRequest:
        return EvalRequest(
            reference=sized_problem(self.problem, dict(self.sizes)),
            candidate=load_candidate(f"{self.problem}__triton"),
            problem_id=self.label,
        )


def _case(problem: str, **sizes: int) -> NoiseCase:
    return NoiseCase(problem, tuple(sizes.items()))


# From ~2 us up (H200 estimates: memory-bound at ~4 TB/s plus ~2-3 us of launch on the GPU).
CASES: tuple[NoiseCase, ...] = (
    _case("relu_large", BATCH=64, DIM=1000),  # 256 KB: the issue-16 case, ~2-4 us
    _case("relu_large", BATCH=1024, DIM=4096),  # 16 MB in + out, ~8 us
    _case("relu_large", BATCH=4096, DIM=65536),  # 1 GB in + out, ~0.5 ms
    _case("softmax_large", BATCH=64, DIM=1024),  # 256 KB, ~3 us
    _case("softmax_large", BATCH=1024, DIM=4096),  # 16 MB, ~10 us
    _case("softmax_large"),  # 1 GB, ~0.85 ms
    _case("sum_dim_large", BATCH=4, DIM1=64, DIM2=256),  # 256 KB, ~3 us
    _case("sum_dim_large", BATCH=16, DIM1=1024, DIM2=1024),  # 64 MB, ~20 us
    _case("small_elementwise"),  # swish on 8 MB, ~8 us
    _case("layernorm_large"),  # 134 MB, ~72 us
    # KernelBench's sizes, one call per window
    _case("relu_large"),  # 6.4 GB in + out, ~4 ms
    _case("sum_dim_large"),  # 8.6 GB in, ~3 ms
    _case("gemm_scale_leakyrelu_large"),  # 1024 x 8192 x 8192 fp32, ~3-9 ms
)


@dataclasses.dataclass
class Record:
    """One evaluation of one case."""

    case: str
    round: int
    tags: list[str]  # "first" (round 0), "after-restart", "after-crash"
    status: str
    speedup: float | None
    method: str | None  # "<method> x<calls per trial>" of the candidate's timing
    reference_ms: float | None
    candidate_ms: float | None
    checks: list[str]
    reference_source: str | None = None
    feedback: str = ""  # the first lines of a result that is not ok (what went wrong)


def record_of(case: str, round_: int, tags: list[str], res: EvalResult) -> Record:
    cand, ref = res.candidate_timing, res.reference_timing
    return Record(
        case=case,
        round=round_,
        tags=tags,
        status=res.status,
        speedup=res.speedup,
        method=f"{cand.method} x{cand.calls_per_trial}" if cand is not None else None,
        reference_ms=ref.median_ms if ref is not None else None,
        candidate_ms=cand.median_ms if cand is not None else None,
        checks=[c.id for c in res.checks],
        reference_source=res.reference_timing_source,
        feedback="" if res.status == STATUS_OK else res.feedback[:600],
    )


@dataclasses.dataclass
class Row:
    """The summary of one case over its evaluations."""

    case: str
    n: int
    ok: int
    timed: int  # evaluations with a speedup
    statuses: dict[str, int]
    methods: list[str]
    escaped: int  # evaluations carrying runtime.escaped_timing
    speedup_mean: float | None = None
    speedup_cv: float | None = None  # population std / mean
    speedup_min: float | None = None
    speedup_max: float | None = None
    reference_ms: float | None = None  # medians over the evaluations
    candidate_ms: float | None = None
    tagged: dict[str, float | None] = dataclasses.field(default_factory=dict)  # tag -> speedup


def cv(xs: Sequence[float]) -> float:
    """Population coefficient of variation; 0 for fewer than two values or a zero mean."""
    if not all(math.isfinite(x) for x in xs):
        return math.inf
    mean = statistics.fmean(xs) if xs else 0.0
    return statistics.pstdev(xs) / mean if len(xs) > 1 and mean else 0.0


def summarize(records: Sequence[Record]) -> list[Row]:
    """One row per case, in the order the cases first appear."""
    rows = []
    for case in dict.fromkeys(r.case for r in records):
        sel = [r for r in records if r.case == case]
        timed = [r for r in sel if r.speedup is not None]
        speedups = [r.speedup for r in timed if r.speedup is not None]
        row = Row(
            case=case,
            n=len(sel),
            ok=sum(r.status == STATUS_OK for r in sel),
            timed=len(timed),
            statuses=dict(Counter(r.status for r in sel)),
            methods=sorted({r.method for r in timed if r.method is not None}),
            escaped=sum(ESCAPED_CHECK in r.checks for r in sel),
            tagged={tag: r.speedup for r in sel for tag in r.tags},
        )
        if speedups:
            row.speedup_mean = statistics.fmean(speedups)
            row.speedup_cv = cv(speedups)
            row.speedup_min, row.speedup_max = min(speedups), max(speedups)
            row.reference_ms = statistics.median(r.reference_ms for r in timed if r.reference_ms is not None)
            row.candidate_ms = statistics.median(r.candidate_ms for r in timed if r.candidate_ms is not None)
        rows.append(row)
    return rows


def failures(rows: Sequence[Row], max_cv: float) -> list[str]:
    """Why the run fails the A/A target (empty: it passes)."""
    out = []
    for r in rows:
        if r.ok < r.n:
            out.append(f"{r.case}: {r.n - r.ok} of {r.n} evaluations not ok ({r.statuses})")
        if len(r.methods) > 1:
            out.append(f"{r.case}: timed by more than one method ({', '.join(r.methods)})")
        if 0 < r.timed < r.ok:
            out.append(f"{r.case}: {r.ok - r.timed} correct evaluations without timing")
        if r.speedup_cv is not None and r.speedup_cv > max_cv:
            out.append(f"{r.case}: speedup CV {100 * r.speedup_cv:.2f} % > {100 * max_cv:.2f} %")
    return out


def _f(x: float | None, spec: str) -> str:
    """`x` formatted by `spec` (width.precision f), or a dash of the same width."""
    return format("-", f">{spec.split('.')[0]}") if x is None else format(x, spec)


def format_table(rows: Sequence[Row]) -> str:
    head = (
        f"{'case':34s} {'n':>3s} {'ok':>3s} {'method':24s} {'ref ms':>9s} {'cand ms':>9s} "
        f"{'speedup':>8s} {'CV %':>6s} {'min':>6s} {'max':>6s} {'restart':>7s} {'crash':>6s} {'esc':>3s}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.case:34s} {r.n:3d} {r.ok:3d} {', '.join(r.methods) or '-':24s} "
            f"{_f(r.reference_ms, '9.4f')} {_f(r.candidate_ms, '9.4f')} {_f(r.speedup_mean, '8.3f')} "
            f"{_f(None if r.speedup_cv is None else 100 * r.speedup_cv, '6.2f')} "
            f"{_f(r.speedup_min, '6.3f')} {_f(r.speedup_max, '6.3f')} "
            f"{_f(r.tagged.get('after-restart'), '7.3f')} {_f(r.tagged.get('after-crash'), '6.3f')} {r.escaped:3d}"
        )
    return "\n".join(lines)


def one_worker_pool(
    devices: str,
    workdir: Path,
    hardening: dict[str, Any] | None = None,
    mps_env: dict[str, str] | None = None,
) -> WorkerPool:
    """A started pool of one worker on `devices` (one GPU id or 'cpu'), with an empty reference
    cache under `workdir`: the first evaluation of a problem measures, as after a first start
    (`hardening`: hardening.Hardening overrides, as the server's flags set them; `mps_env`: the
    server's MPS daemon's client environment, which a GPU worker's judge times through)."""
    slots = parse_slots(devices, 1, 1)
    if len(slots) != 1:
        raise SystemExit(f"--devices: give one GPU id or 'cpu' (one worker), got {devices!r}")
    pool = WorkerPool(
        PoolConfig(
            slots=slots,
            workdir=workdir / "pool",
            default_timeout_s=600.0,
            max_timeout_s=900.0,
            ref_cache=workdir / "ref_timing.sqlite",
            hardening=dict(hardening or {}),
            mps_env=dict(mps_env or {}),
        )
    )
    pool.start(block=True)
    return pool


@contextlib.contextmanager
def mps_daemon(devices: str, workdir: Path) -> Iterator[dict[str, str]]:
    """The server's own MPS daemon for GPU workers (as `python -m eval_server` starts it: without
    it the judge's and runner's contexts time-slice and short windows cannot be timed); the
    client environment, empty for CPU workers."""
    if devices.strip().lower() == "cpu":
        yield {}
        return
    from eval_server.isolation import mps

    with mps.client_env(workdir) as env:
        yield env


def run(
    cases: Sequence[NoiseCase],
    devices: str,
    repeats: int,
    pause_s: float,
    restart_at: int,
    crash_at: int,
    workdir: Path,
    hardening: dict[str, Any] | None = None,
) -> list[Record]:
    """Evaluate every case `repeats` times, round-robin, through one pool worker (one_worker_pool)."""
    crash = EvalRequest(
        reference=samples.load_problem("relu"), candidate=samples.load_candidate("relu__segfault")
    )
    records: list[Record] = []
    with mps_daemon(devices, workdir) as mps_env:
        pool = one_worker_pool(devices, workdir, hardening, mps_env)
        try:
            for rnd in range(repeats):
                tags = ["first"] if rnd == 0 else []
                if rnd == restart_at:
                    before = pool.workers[0].info.get("pid")
                    pool.workers[0].restart()
                    print(
                        f"round {rnd}: worker restarted (pid {before} -> {pool.workers[0].info.get('pid')})"
                    )
                    tags.append("after-restart")
                if rnd == crash_at:
                    print(f"round {rnd}: crashing candidate -> {pool.evaluate(crash).status}", flush=True)
                    tags.append("after-crash")
                for case in cases:
                    rec = record_of(case.label, rnd, tags, pool.evaluate(case.request()))
                    records.append(rec)
                    print(json.dumps(dataclasses.asdict(rec)), flush=True)
                if rnd < repeats - 1:
                    time.sleep(pause_s)
        finally:
            pool.close()
    return records


def select_cases(spec: str) -> list[NoiseCase]:
    if not spec:
        return list(CASES)
    by_label = {c.label: c for c in CASES}
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in by_label]
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; known: {', '.join(by_label)}")
    return [by_label[w] for w in wanted]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="0", help="one GPU id, or 'cpu' (correctness only: no timing)")
    p.add_argument("--repeats", type=int, default=10, help="evaluations per case (rounds)")
    p.add_argument(
        "--pause-s", type=float, default=15.0, help="wait between rounds (spreads them over minutes)"
    )
    p.add_argument(
        "--restart-at", type=int, default=3, help="restart the worker before this round (-1: never)"
    )
    p.add_argument(
        "--crash-at", type=int, default=6, help="evaluate a crashing candidate before this round (-1: never)"
    )
    p.add_argument(
        "--cases",
        default="",
        help="comma-separated case labels (default: all): " + ", ".join(c.label for c in CASES),
    )
    p.add_argument("--max-cv", type=float, default=0.02, help="fail when a case's speedup CV is above this")
    p.add_argument("--json", type=Path, help="write every evaluation and the summary here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    cases = select_cases(args.cases)
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        records = run(
            cases,
            args.devices,
            args.repeats,
            args.pause_s,
            args.restart_at,
            args.crash_at,
            Path(tmp),
        )
    rows = summarize(records)
    print()
    print(format_table(rows))
    problems = failures(rows, args.max_cv)
    if args.json:
        report = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": [dataclasses.asdict(r) for r in rows],
            "records": [dataclasses.asdict(r) for r in records],
            "failures": problems,
        }
        args.json.write_text(json.dumps(report, indent=1))
    for line in problems:
        print(f"FAIL {line}")
    if any(r.timed for r in rows) or problems:
        return EXIT_FAILED if problems else EXIT_OK
    print(
        "NO TIMING: no evaluation reported a speedup. CPU workers check correctness in Triton's "
        "interpreter and time nothing, so there is no noise to measure here; run on a GPU machine "
        "(e.g. --devices 0)."
    )
    return EXIT_NO_TIMING


if __name__ == "__main__":
    sys.exit(main())
