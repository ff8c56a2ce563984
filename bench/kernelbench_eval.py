"""One evaluation by KernelBench's own harness, in this fresh process (the comparison point of
`bench/eval_throughput.py --kernelbench DIR`).

DIR is a local checkout of ScalingIntelligence/KernelBench. Its `src/` goes on sys.path and its
`kernelbench.eval.eval_kernel_against_ref` is called as is (Triton backend, or with `--backend cuda`
its CUDA backend, which execs the candidate and so builds its load_inline extension; N correctness
trials, M performance trials of the candidate and of the reference, excessive-speedup check on):
nothing of it is copied or changed here. The process is started once per evaluation, as
KernelBench's scripts do, so the wall time the caller measures includes Python start, `import
torch`, CUDA init and Triton compilation or the extension's build (`--build-dir`: KernelBench's own
build_dir argument; a directory that already holds the build is a cache hit).

KernelBench's package imports its LLM clients (`openai`, `litellm`) at import time; the evaluation
never calls them. Where a client is not installed (the GPU machines cannot install litellm's ~60 MB
of dependencies), an empty module stands in for it whose names raise if anything ever calls them,
so the evaluation code that runs is KernelBench's own. Real packages are always preferred.

  python bench/kernelbench_eval.py --kernelbench third_party/KernelBench \
      --problem third_party/KernelBench/KernelBench/level1/19_ReLU.py \
      --candidate bench/candidates/relu_large__triton.py
Prints one JSON line: {"compiled", "correct", "runtime_ms", "ref_runtime_ms" (KernelBench's mean
over its timed trials, milliseconds), "speedup", "seconds": {...}, "metadata": {...}}.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# Modules KernelBench imports at package import only to query LLM providers: name -> attributes
# its import statements take from them.
LLM_CLIENT_MODULES: dict[str, tuple[str, ...]] = {"openai": ("OpenAI",), "litellm": ("completion",)}


def _unavailable(module: str, name: str) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(
            f"{module}.{name} is not installed in this bench process (KernelBench's evaluation never calls it)"
        )

    return call


def stand_in_missing_llm_clients() -> list[str]:
    """Register an empty module for each LLM client that cannot be imported; return their names."""
    missing = []
    for module, names in LLM_CLIENT_MODULES.items():
        if module in sys.modules or importlib.util.find_spec(module) is not None:
            continue
        stand_in = types.ModuleType(module)
        for name in names:
            setattr(stand_in, name, _unavailable(module, name))
        sys.modules[module] = stand_in
        missing.append(module)
    return missing


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)[:500]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--kernelbench", type=Path, required=True, help="checkout of ScalingIntelligence/KernelBench"
    )
    p.add_argument("--problem", type=Path, required=True)
    p.add_argument("--candidate", type=Path, required=True)
    p.add_argument("--correct-trials", type=int, default=5)
    p.add_argument("--perf-trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--backend", choices=["triton", "cuda"], default="triton")
    p.add_argument("--build-dir", type=Path, help="cuda: where load_inline builds (KernelBench's build_dir)")
    args = p.parse_args()
    src = args.kernelbench.resolve() / "src"
    if not (src / "kernelbench" / "eval.py").is_file():
        print(
            json.dumps(
                {
                    "error": f"{src}/kernelbench/eval.py not found: is {args.kernelbench} a KernelBench checkout?"
                }
            )
        )
        return 2
    sys.path.insert(0, str(src))
    stood_in = stand_in_missing_llm_clients()
    import torch
    from kernelbench.eval import eval_kernel_against_ref

    seconds = {"import": time.perf_counter() - T_START}
    t = time.perf_counter()
    result = eval_kernel_against_ref(
        original_model_src=args.problem.read_text(encoding="utf-8"),
        custom_model_src=args.candidate.read_text(encoding="utf-8"),
        seed_num=args.seed,
        num_correct_trials=args.correct_trials,
        num_perf_trials=args.perf_trials,
        measure_performance=True,
        backend=args.backend,
        build_dir=str(args.build_dir.resolve()) if args.build_dir else None,
        device=torch.device("cuda", 0),
    )
    seconds["eval_kernel_against_ref"] = time.perf_counter() - t
    seconds["total_in_process"] = time.perf_counter() - T_START
    if result is None:  # KernelBench's answer to a compile-lock error: "retry"
        print(json.dumps({"error": "eval_kernel_against_ref returned None (lock error)", "seconds": seconds}))
        return 1
    runtime, ref = float(result.runtime), float(result.ref_runtime)
    out = {
        "compiled": bool(result.compiled),
        "correct": bool(result.correctness),
        "runtime_ms": runtime,
        "ref_runtime_ms": ref,
        "speedup": ref / runtime if runtime > 0 and ref > 0 else None,
        "seconds": seconds,
        "stood_in": stood_in,
        "metadata": _jsonable(result.metadata),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
