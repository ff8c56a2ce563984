"""Is a legitimate small kernel rejected by `runtime.escaped_timing` right after a failed
evaluation? GPU tests saw ~2 us ReLU evaluations rejected in all three timings now and then,
each time right after a syntax error or a GPU fault; the spare child's preparation alone did
not cause it (a probe of the former in-process timing: no escaped timing in 127 timings
overlapping one).

One pool worker (as a server with one worker per GPU), its reference cache warmed first. Each
round evaluates, for every kind of predecessor, the failing candidate and then a correct small
kernel (`--after`, a bench/timing_noise.py case), and records the small kernel's status, its
escape warning or rejection, each escape check's excess (`escape_tail_ms`, `escape_launch_ms`,
per call, negative when it passed) and the phases that could explain it (spare_wait,
child_exit). Kinds: `none` (a correct evaluation precedes), `syntax_error` (answered in
milliseconds: the next child is still preparing), `segfault` (the child dies), `illegal_address`
(a GPU fault). `--hardening` JSON overrides of hardening.Hardening, repeatable: each is run in
turn with a fresh pool (e.g. '{"escape_retimes": 4}' against the default).

  python3 bench/escape_after_failure.py --devices 0 --rounds 12 --json escape.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing_noise import ESCAPED_CHECK, NoiseCase, one_worker_pool, select_cases  # noqa: E402
from eval_server import samples  # noqa: E402
from eval_server.schema import STATUS_OK, EvalOptions, EvalRequest, EvalResult  # noqa: E402

# A Triton store far outside any allocation: the CUDA context faults (illegal address).
ILLEGAL_ADDRESS = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def far_store(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs + (1 << 40), tl.load(x_ptr + offs, mask=offs < n))


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        far_store[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""

KINDS = ("none", "syntax_error", "segfault", "illegal_address")
PHASES = ("spare_wait", "child_exit", "timing")


def predecessor(kind: str) -> EvalRequest | None:
    """The failing evaluation that precedes the small kernel's (None: a correct one does)."""
    sources = {
        "syntax_error": samples.load_candidate("relu__syntax_error"),
        "segfault": samples.load_candidate("relu__segfault"),
        "illegal_address": ILLEGAL_ADDRESS,
    }
    if kind == "none":
        return None
    return EvalRequest(
        reference=samples.load_problem("relu"), candidate=sources[kind], options=EvalOptions(timeout_s=30)
    )


@dataclasses.dataclass
class Record:
    """The small kernel's evaluation after one predecessor."""

    config: str  # the hardening overrides, as JSON
    kind: str
    round: int
    before_status: str | None
    status: str
    speedup: float | None
    escape: str | None  # None, "warn" (re-timed clean) or "reject"
    escape_message: str | None
    escape_tail_ms: float | None  # the reported timing's checks (None when rejected: no timing)
    escape_launch_ms: float | None
    phases: dict[str, float]


def record_of(config: str, kind: str, rnd: int, before: str | None, res: EvalResult) -> Record:
    esc = next((c for c in res.checks if c.id == ESCAPED_CHECK), None)
    cand = res.candidate_timing
    return Record(
        config=config,
        kind=kind,
        round=rnd,
        before_status=before,
        status=res.status,
        speedup=res.speedup,
        escape=esc.severity if esc is not None else None,
        escape_message=esc.message if esc is not None else None,
        escape_tail_ms=cand.escape_tail_ms if cand is not None else None,
        escape_launch_ms=cand.escape_launch_ms if cand is not None else None,
        phases={p: res.phases[p] for p in PHASES if p in res.phases},
    )


@dataclasses.dataclass
class Row:
    """One (config, kind) over its rounds."""

    config: str
    kind: str
    n: int
    ok: int
    warned: int  # re-timed after an escaped timing, then clean
    rejected: int  # escaped in every timing
    speedup_mean: float | None
    speedup_cv: float | None
    spare_wait_mean: float
    timing_mean: float  # the timing phase, re-timings included


def summarize(records: Sequence[Record]) -> list[Row]:
    """One row per (config, kind), in the order they first appear."""
    keys = list(dict.fromkeys((r.config, r.kind) for r in records))
    rows = []
    for config, kind in keys:
        rs = [r for r in records if (r.config, r.kind) == (config, kind)]
        sp = [r.speedup for r in rs if r.speedup is not None]
        mean = statistics.fmean(sp) if sp else None
        rows.append(
            Row(
                config=config,
                kind=kind,
                n=len(rs),
                ok=sum(r.status == STATUS_OK for r in rs),
                warned=sum(r.escape == "warn" for r in rs),
                rejected=sum(r.escape == "reject" for r in rs),
                speedup_mean=mean,
                speedup_cv=statistics.pstdev(sp) / mean if mean else None,
                spare_wait_mean=statistics.fmean(r.phases.get("spare_wait", 0.0) for r in rs),
                timing_mean=statistics.fmean(r.phases.get("timing", 0.0) for r in rs),
            )
        )
    return rows


def table(rows: Sequence[Row]) -> str:
    lines = [
        f"{'config':28s} {'before':16s} {'n':>3s} {'ok':>3s} {'warn':>4s} {'rej':>3s} "
        f"{'speedup':>8s} {'CV %':>6s} {'spare s':>7s} {'timing s':>8s}"
    ]
    for r in rows:
        sp = f"{r.speedup_mean:8.3f}" if r.speedup_mean is not None else f"{'-':>8s}"
        cv = f"{100 * r.speedup_cv:6.2f}" if r.speedup_cv is not None else f"{'-':>6s}"
        lines.append(
            f"{r.config[:28]:28s} {r.kind:16s} {r.n:3d} {r.ok:3d} {r.warned:4d} {r.rejected:3d} "
            f"{sp} {cv} {r.spare_wait_mean:7.3f} {r.timing_mean:8.3f}"
        )
    return "\n".join(lines)


def run(
    case: NoiseCase, devices: str, rounds: int, kinds: Sequence[str], hardening: dict[str, Any], workdir: Path
) -> list[Record]:
    """All rounds under one hardening config, through one fresh pool worker."""
    config = json.dumps(hardening, sort_keys=True)
    pool = one_worker_pool(devices, workdir, hardening)
    records: list[Record] = []
    try:
        for _ in range(2):  # compile, fill the reference cache: round 0 starts in the steady state
            warm = pool.evaluate(case.request())
        print(f"{config}: warm-up {warm.status}, speedup {warm.speedup}", flush=True)
        for rnd in range(rounds):
            for kind in kinds:
                req = predecessor(kind)
                before = pool.evaluate(req).status if req is not None else None
                rec = record_of(config, kind, rnd, before, pool.evaluate(case.request()))
                records.append(rec)
                print(json.dumps(dataclasses.asdict(rec)), flush=True)
    finally:
        pool.close()
    return records


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="0", help="one GPU id ('cpu' runs the bookkeeping only)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument(
        "--after", default="relu_large:64x1000", help="the small kernel (a bench/timing_noise.py case)"
    )
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help=f"predecessors, comma-separated: {', '.join(KINDS)}"
    )
    ap.add_argument(
        "--hardening",
        action="append",
        type=json.loads,
        help="hardening overrides as JSON, repeatable (default {})",
    )
    ap.add_argument("--json", type=Path, help="write records and rows here")
    ap.add_argument("--workdir", type=Path, help="pool workdir (default: a temporary directory)")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; known: {', '.join(KINDS)}")
    (case,) = select_cases(args.after)
    configs = args.hardening or [{}]
    records: list[Record] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = args.workdir or Path(tmp)
        for i, hardening in enumerate(configs):
            records += run(case, args.devices, args.rounds, kinds, hardening, base / f"config{i}")
    rows = summarize(records)
    print(table(rows))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "records": [dataclasses.asdict(r) for r in records],
                    "rows": [dataclasses.asdict(r) for r in rows],
                },
                indent=1,
            )  # fmt: skip
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
