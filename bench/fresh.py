"""Never-seen candidates for throughput benchmarks: what an RL step sends.

A policy's kernels differ from request to request, so neither Triton's cache nor any cache of the
evaluator can serve them. `fresh_source` makes a candidate new the same way: every `@triton.jit`
function gets a unique name (Triton's cache key hashes the function's source, its name included)
and the file a unique first line. `fresh_requests` draws an RL-like mix of such requests:

- `samples`: the bundled sample cases (eval_server/samples: correct, incorrect, compile errors, a
  timeout, rejected hacks, each with the status it must get);
- a list of (name, problem, candidate) jobs (bench/eval_throughput.py's KernelBench cases): every
  `compile_error_every`-th request gets a name that does not exist inside its first kernel
  (a compile error, as ~30 % of a policy's early kernels are), the others must be `ok`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eval_server import samples

_JIT = re.compile(r"@triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(\w+)\s*\(")
# what the bundled timeout case gets (as tools.eval_samples gives it): a timeout costs its limit
SHORT_TIMEOUT_S = {"relu__infinite_loop": 10.0}


def jit_functions(source: str) -> list[str]:
    return _JIT.findall(source)


def fresh_source(source: str, tag: str) -> str:
    """`source` with every @triton.jit function renamed `<name>_<tag>` and a first line naming
    `tag`: a kernel no cache has seen."""
    for name in jit_functions(source):
        source = re.sub(rf"\b{re.escape(name)}\b", f"{name}_{tag}", source)
    return f"# fresh candidate {tag}\n{source}"


def break_first_kernel(source: str) -> str:
    """`source` whose first @triton.jit function uses a name that exists nowhere (Triton's
    compile error), placed as its first statement."""
    match = _JIT.search(source)
    if match is None:
        raise ValueError("no @triton.jit function to break")
    body = source.index(":\n", match.end()) + 2
    indent = re.match(r"[ \t]*", source[body:]).group(0) or "    "
    return (
        f"{source[:body]}{indent}_fresh_undefined = tl.undefined_name_of_a_fresh_candidate\n{source[body:]}"
    )


@dataclass(frozen=True)
class FreshRequest:
    """One eval request of a fresh candidate and the status it must get."""

    name: str
    problem_source: str
    candidate_source: str
    expected_status: str
    timeout_s: float | None = None


def fresh_requests(
    jobs: Sequence[tuple[str, Path, Path]] | None,
    n: int,
    run_tag: str,
    compile_error_every: int = 3,
) -> list[FreshRequest]:
    """`n` requests, each candidate unique (tag `<run_tag>_<i>`), cycling over the mix."""
    out = []
    if jobs is None:
        cases = [c for c in samples.SAMPLE_CASES if c.backend == "triton"]
        for i in range(n):
            c = cases[i % len(cases)]
            out.append(
                FreshRequest(
                    c.candidate,
                    samples.load_problem(c.problem),
                    fresh_source(samples.load_candidate(c.candidate), f"{run_tag}_{i}"),
                    c.expected_status,
                    SHORT_TIMEOUT_S.get(c.candidate),
                )
            )
        return out
    for i in range(n):
        name, problem, candidate = jobs[i % len(jobs)]
        source = candidate.read_text(encoding="utf-8")
        broken = compile_error_every > 0 and i % compile_error_every == compile_error_every - 1
        if broken:
            source = break_first_kernel(source)
        out.append(
            FreshRequest(
                name + (" (broken)" if broken else ""),
                problem.read_text(encoding="utf-8"),
                fresh_source(source, f"{run_tag}_{i}"),
                "compile_error" if broken else "ok",
            )
        )
    return out
