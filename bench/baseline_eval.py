"""The common-practice evaluation this project's evaluator is compared against.

One fresh Python process per evaluation (import torch and triton, initialise CUDA), inputs
built by the problem's `get_inputs()` on the CPU and copied to the GPU for every trial, N
correctness trials, then N timed calls of each model with CUDA events. This is how
KernelBench-style harnesses commonly evaluate; `bench/eval_throughput.py` runs it as a
subprocess per evaluation, in the same invocation as our server, and compares throughput.

  python bench/baseline_eval.py --problem P.py --candidate C.py [--trials 5] [--timing-trials 100]
Prints one JSON line: {"correct": ..., "speedup": ..., "seconds": {...}}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

T_START = time.perf_counter()

import torch  # noqa: E402  (import time is part of what is measured)


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _time(model: torch.nn.Module, inputs: list, trials: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(trials):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--problem", type=Path, required=True)
    p.add_argument("--candidate", type=Path, required=True)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--timing-trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    import triton  # noqa: F401

    torch.cuda.init()
    seconds["import_and_cuda_init"] = time.perf_counter() - T_START
    t = time.perf_counter()
    problem = _load(args.problem, "baseline_problem")
    candidate = _load(args.candidate, "baseline_candidate")
    init = problem.get_init_inputs()
    torch.manual_seed(args.seed)
    model = problem.Model(*init).cuda()
    torch.manual_seed(args.seed)
    model_new = candidate.ModelNew(*init).cuda()
    seconds["load"] = time.perf_counter() - t
    t = time.perf_counter()
    correct = True
    with torch.no_grad():
        for trial in range(args.trials):
            torch.manual_seed(args.seed + trial)
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
            ref = model(*inputs)
            out = model_new(*inputs)
            torch.cuda.synchronize()
            correct &= bool(torch.allclose(ref, out, atol=1e-2, rtol=1e-2))
            del ref, out
    seconds["correctness"] = time.perf_counter() - t
    t = time.perf_counter()
    speedup = None
    if correct:
        torch.manual_seed(args.seed)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
        ref_ms = _time(model, inputs, args.timing_trials)
        new_ms = _time(model_new, inputs, args.timing_trials)
        speedup = ref_ms / new_ms
    seconds["timing"] = time.perf_counter() - t
    seconds["total_in_process"] = time.perf_counter() - T_START
    print(json.dumps({"correct": correct, "speedup": speedup, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
