"""Evaluate the bundled sample problems with the bundled sample candidates and print a table.

By default this starts a real eval server (CPU interpreter mode on a machine without a GPU),
waits for its /health, sends every sample over HTTP with the async client, prints one row per
case (expected vs got status, speedup when timed, the checks that fired), and stops the server.
Exit code 0 only if every case got its expected status.

  python -m tools.eval_samples                       # start a local server, evaluate, stop
  python -m tools.eval_samples --url http://host:18188   # use a running server
  python -m tools.eval_samples --devices 0 --json out.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from eval_server import samples
from eval_server.launch import running_server
from eval_server.schema import EvalOptions, EvalResult
from krl_common.cli import make_parser
from krl_common.shutdown import interrupt_on_termination, interrupted_exit_code
from krl_common.urls import unreachable
from slime_ext.clients.eval_client import EvalClient

# Cases that would otherwise wait for the full default limit.
_SHORT_TIMEOUT_S = {"relu__infinite_loop": 10.0}


async def evaluate_all(
    url: str, concurrency: int, trials: int
) -> list[tuple[samples.SampleCase, EvalResult, float]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(
        client: EvalClient, case: samples.SampleCase
    ) -> tuple[samples.SampleCase, EvalResult, float]:
        options = EvalOptions(correctness_trials=trials, timeout_s=_SHORT_TIMEOUT_S.get(case.candidate))
        async with sem:
            t0 = time.perf_counter()
            result = await client.evaluate_source(
                samples.load_problem(case.problem),
                samples.load_candidate(case.candidate),
                options=options,
                problem_id=case.problem,
            )
            return case, result, time.perf_counter() - t0

    async with EvalClient(url) as client:
        return await asyncio.gather(*(one(client, c) for c in samples.SAMPLE_CASES))


def render_table(rows: list[tuple[samples.SampleCase, EvalResult, float]]) -> str:
    header = ("candidate", "expected", "got", "match", "speedup", "seconds", "checks / error")
    table = [header]
    for case, res, secs in rows:
        detail = ", ".join(c.id for c in res.checks) or (res.error or {}).get("type", "")
        speed = f"{res.speedup:.2f}x" if res.speedup is not None else "-"
        table.append(
            (
                case.candidate,
                case.expected_status,
                res.status,
                "yes" if res.status == case.expected_status else "NO",
                speed,
                f"{secs:.2f}",
                detail,
            )
        )
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.eval_samples", __doc__)
    p.add_argument("--url", help="evaluate against this running server instead of starting one")
    p.add_argument("--devices", default="auto", help="for the started server: 'auto', 'cpu' or GPU ids")
    p.add_argument("--workers", type=int, default=2, help="CPU workers of the started server")
    p.add_argument("--concurrency", type=int, default=4, help="evaluations in flight")
    p.add_argument("--trials", type=int, default=5, help="correctness trials per case")
    p.add_argument("--json", type=Path, help="also write the full results here")
    args = p.parse_args(argv)
    # SIGTERM/SIGHUP take the Ctrl-C path, so the started eval server and its workers are stopped.
    interrupt_on_termination()

    if args.url and (why := unreachable(args.url)) is not None:
        print(f"error: --url {args.url}: {why}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        if args.url:
            rows = asyncio.run(evaluate_all(args.url, args.concurrency, args.trials))
        else:
            with tempfile.TemporaryDirectory(prefix="eval-samples-") as tmp:
                server_args = ["--devices", args.devices, "--cpu-workers", str(args.workers)]
                print(f"starting eval server ({' '.join(server_args)}) ...", flush=True)
                with running_server(Path(tmp), server_args) as url:
                    print(
                        f"eval server healthy at {url}; evaluating {len(samples.SAMPLE_CASES)} cases",
                        flush=True,
                    )
                    rows = asyncio.run(evaluate_all(url, args.concurrency, args.trials))
    except KeyboardInterrupt:
        print("interrupted: the eval server it started is stopped", file=sys.stderr)
        return interrupted_exit_code()
    print(render_table(rows))
    mismatches = [case.candidate for case, res, _ in rows if res.status != case.expected_status]
    print(
        f"\n{len(rows) - len(mismatches)}/{len(rows)} cases as expected in {time.perf_counter() - t0:.1f} s"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"case": c.candidate, "expected": c.expected_status, "seconds": s, "result": r.to_json()}
                    for c, r, s in rows
                ],
                indent=1,
            )
        )
    if mismatches:
        print("unexpected:", ", ".join(mismatches), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
