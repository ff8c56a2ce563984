"""Per-phase wall time of in-process CPU evaluations (Triton interpreter) of the bundled correct
candidates: what a change of the evaluation flow costs on the CPU side (e.g. computing each
reference output after the candidate's instead of all of them up front).

Run from the repository root in a fresh process (the interpreter must be chosen before triton
is imported): `TRITON_INTERPRET=1 python -m bench.eval_phases_cpu --repeats 5`. Prints one line
per problem with the median seconds of the phases `reference`, `load_candidate`, `correctness`
and of the whole evaluation. `--facts-cache` runs each problem twice in the same process: without
a reference cache, then with one (its first, uncounted run fills it; the counted ones hit it),
so the two `reference` columns compare the reference phase with and without its cached facts.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from eval_server import samples
from eval_server.pipeline import evaluate
from eval_server.pipeline.context import LAUNCHES, THREADS, EvalContext
from eval_server.pipeline.ref_cache import RefTimingCache
from eval_server.schema import EvalOptions, EvalRequest

PHASES = ("reference", "reference_precision", "load_candidate", "correctness")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trials", type=int, default=5, help="correctness trials per evaluation")
    parser.add_argument(
        "--facts-cache", action="store_true", help="also run with a reference cache (cached reference facts)"
    )
    args = parser.parse_args()
    LAUNCHES.install()
    THREADS.install()
    workdir = Path(tempfile.mkdtemp(prefix="eval-phases-"))
    for problem in ("relu", "softmax", "sum_dim", "matmul", "gemm_scale_leakyrelu"):
        request = EvalRequest(
            reference=samples.load_problem(problem),
            candidate=samples.load_candidate(f"{problem}__correct"),
            options=EvalOptions(correctness_trials=args.trials),
        )
        for cached in (False, True) if args.facts_cache else (False,):
            cache_path = workdir / f"{problem}-ref.sqlite"
            rows: dict[str, list[float]] = {name: [] for name in (*PHASES, "total")}
            for i in range(args.repeats + 1):  # the first run compiles and warms caches: not counted
                ctx = EvalContext(torch.device("cpu"), "cpu", workdir, timing_enabled=False)
                ctx.ref_cache = RefTimingCache(cache_path) if cached else None
                result = evaluate.evaluate(request, ctx)
                assert result.status == "ok", result.feedback
                if i:
                    for name in PHASES:
                        rows[name].append(result.phases.get(name, 0.0))
                    rows["total"].append(result.elapsed_s)
            cells = "  ".join(f"{name} {statistics.median(v):.4f}" for name, v in rows.items())
            print(f"{problem:22s} {'facts cached' if cached else 'no cache':12s} {cells}", flush=True)


if __name__ == "__main__":
    main()
