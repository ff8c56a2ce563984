"""One candidate, one command: evaluate CANDIDATE.py against PROBLEM.py and print what the model
would see after that turn (the feedback message of the episode), then the status, the speedup and
the checks that fired.

  python -m tools.eval_one PROBLEM.py CANDIDATE.py                   # starts an eval server here
  python -m tools.eval_one PROBLEM.py CANDIDATE.py --url http://host:18188
  python -m tools.eval_one PROBLEM.py CANDIDATE.py --devices 0 --backend cuda

The exit code says the status, for scripts: 0 ok; 10 compile_error, 11 runtime_error,
12 incorrect, 13 rejected, 14 timeout, 15 crashed (the candidate's); 20 reference_error,
21 server_error, 22 unsupported (the evaluator's or the machine's); 2 bad input or an
unreachable --url; 130 interrupted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType

from eval_server.launch import running_server
from eval_server.schema import EvalOptions, EvalResult
from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.shutdown import interrupt_on_termination, interrupted_exit_code
from krl_common.urls import unreachable
from slime_ext.clients.backends import BACKENDS, DEFAULT_BACKEND
from slime_ext.clients.eval_client import EvalClient
from slime_ext.rollout.prompts import feedback_text
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe

EXIT_CODES = MappingProxyType(
    {
        "ok": 0,
        "compile_error": 10,
        "runtime_error": 11,
        "incorrect": 12,
        "rejected": 13,
        "timeout": 14,
        "crashed": 15,
        "reference_error": 20,
        "server_error": 21,
        "unsupported": 22,
    }
)


# The server's own limit on one evaluation, beyond options.timeout_s (pool.PoolConfig.outer_grace_s),
# plus a margin for the queue: the client waits this much longer than the evaluation may take.
_CLIENT_MARGIN_S = 60.0


async def evaluate(url: str, problem: str, candidate: str, options: EvalOptions, backend: str) -> EvalResult:
    wait = (options.timeout_s or 600.0) + _CLIENT_MARGIN_S
    async with EvalClient(url, timeout_s=wait) as client:
        return await client.evaluate_source(problem, candidate, options=options, backend=backend)


def summary(result: EvalResult) -> str:
    """The lines after the feedback: status, speedup and timings, checks, error type."""
    lines = [f"status: {result.status}"]
    if result.speedup is not None:
        lines.append(f"speedup: {result.speedup:.3f}x")
    elif result.correct:
        lines.append("speedup: not measured (no timing on this worker)")
    if result.checks:
        lines.append("checks: " + ", ".join(f"{c.id} ({c.severity})" for c in result.checks))
    if result.error:
        lines.append(f"error: {result.error.get('type', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.eval_one", __doc__)
    p.add_argument("problem", type=Path, help="the reference: a KernelBench-style file with class Model")
    p.add_argument("candidate", type=Path, help="the candidate: a file with class ModelNew")
    p.add_argument("--url", help="a running eval server; else one is started here")
    p.add_argument("--devices", default="auto", help="for the started server: 'auto', 'cpu' or GPU ids")
    p.add_argument(
        "--backend", choices=BACKENDS, default=None, help=f"kernel language (default {DEFAULT_BACKEND})"
    )
    p.add_argument("--trials", type=int, default=None, help="correctness trials (default: the server's)")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=120.0,
        help="the evaluation's wall-clock limit: a hanging candidate ends as `timeout` after it (default 120)",
    )
    p.add_argument("--recipe", type=Path, help="a run recipe: its episode.prompt words the feedback")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON after the summary")
    args = p.parse_args(argv)
    interrupt_on_termination()
    try:
        problem = args.problem.read_text(encoding="utf-8")
        candidate = args.candidate.read_text(encoding="utf-8")
        episode = episode_config_from_recipe(
            load_recipe(args.recipe) if args.recipe else None, backend=args.backend
        )
        if not args.timeout_s > 0:
            raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
        options = EvalOptions(
            timeout_s=args.timeout_s, **{"correctness_trials": args.trials} if args.trials is not None else {}
        )
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.url and (why := unreachable(args.url)) is not None:
        print(f"error: --url {args.url}: {why}", file=sys.stderr)
        return EXIT_USAGE
    backend = episode.backend
    waiting = f"evaluating {args.candidate.name} (at most {args.timeout_s:g} s) ..."
    try:
        if args.url:
            print(waiting, file=sys.stderr, flush=True)
            result = asyncio.run(evaluate(args.url, problem, candidate, options, backend))
        else:
            with tempfile.TemporaryDirectory(prefix="eval-one-") as tmp:
                print(f"starting an eval server (--devices {args.devices}) ...", file=sys.stderr, flush=True)
                with running_server(Path(tmp), ["--devices", args.devices, "--cpu-workers", "1"]) as url:
                    print(waiting, file=sys.stderr, flush=True)
                    result = asyncio.run(evaluate(url, problem, candidate, options, backend))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return interrupted_exit_code()
    except (OSError, RuntimeError) as exc:  # the started server did not come up; the evaluation failed
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODES["server_error"]
    print(feedback_text(result, episode.prompt))
    print()
    print(summary(result))
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    return EXIT_CODES.get(result.status, EXIT_CODES["server_error"])


if __name__ == "__main__":
    sys.exit(main())
