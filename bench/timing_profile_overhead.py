"""What recording every kernel with CUPTI (torch.profiler, CUDA activity) costs the timing.

Issue 30 asks that launch counting, foreign kernels and streams be checked on the timed calls,
not only on the first correctness call. That is only fair if a timing under the profiler
measures what a timing without it measures, for reference and candidate alike. This times the
reference and the Triton candidate of each case of bench/timing_noise.py with the evaluator's
own `time_gpu`, alternating plain and profiled timings round by round in one process, and
prints per case: the medians of both modes, the profiled / plain ratio of each model and of the
speedup, and the profiler's own wall time (start, stop, reading the recorded kernels).

  python bench/timing_profile_overhead.py --rounds 6 --json overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.timing_noise import CASES, NoiseCase  # noqa: E402
from eval_server.pipeline import loader  # noqa: E402
from eval_server.pipeline.timing import calls_per_trial_for, l2_flush_buffer, time_gpu  # noqa: E402


def _models(case: NoiseCase, workdir: Path, device: torch.device) -> tuple[Any, Any, Any]:
    req = case.request()
    ref_mod = loader.import_source(req.reference, workdir, "reference")
    cand_mod = loader.import_source(req.candidate, workdir, "candidate")
    init = ref_mod.get_init_inputs()
    ref = loader.build_model(ref_mod.Model, init, 0, device)
    cand = loader.build_model(cand_mod.ModelNew, init, 0, device)
    return ref_mod, ref, cand


def _timed(model: Any, sets: list[list[Any]], device: torch.device, flush: torch.Tensor, calls: int,
           profiled: bool) -> tuple[float, float, int]:  # fmt: skip
    """(median ms per call, profiler wall ms beyond the timing, kernels recorded)."""
    if not profiled:
        stats = time_gpu(model, sets, trials=100, warmup=3, device=device, flush=flush, calls_per_trial=calls,
                         min_trials=30, ci_rel=0.01)  # fmt: skip
        return stats.median_ms, 0.0, 0
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.__enter__()
    t1 = time.perf_counter()
    stats = time_gpu(model, sets, trials=100, warmup=3, device=device, flush=flush, calls_per_trial=calls,
                     min_trials=30, ci_rel=0.01)  # fmt: skip
    t2 = time.perf_counter()
    prof.__exit__(None, None, None)
    kernels = sum(1 for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA)
    t3 = time.perf_counter()
    return stats.median_ms, (t1 - t0 + t3 - t2) * 1e3, kernels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cases", default="", help="comma-separated case labels (default: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = torch.device("cuda", 0)
    flush = l2_flush_buffer(device)
    wanted = {c for c in args.cases.split(",") if c}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for case in CASES:
            if wanted and case.label not in wanted:
                continue
            work = Path(tmp) / case.label.replace(":", "_")
            work.mkdir()
            ref_mod, ref, cand = _models(case, work, device)
            sets = [loader.make_inputs(ref_mod, s, device) for s in (1, 2, 3)]
            single = time_gpu(ref, sets, trials=30, warmup=3, device=device, flush=flush)
            calls = calls_per_trial_for(single.median_ms)
            got: dict[str, list[float]] = {k: [] for k in ("ref", "ref_prof", "cand", "cand_prof")}
            cost: list[float] = []
            kernels: list[int] = []
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for profiled in order:
                    for name, model in (("ref", ref), ("cand", cand)):
                        ms, extra, n = _timed(model, sets, device, flush, calls, profiled)
                        got[name + ("_prof" if profiled else "")].append(ms)
                        if profiled:
                            cost.append(extra)
                            kernels.append(n)
            med = {k: statistics.median(v) for k, v in got.items()}
            row = {
                "case": case.label,
                "calls_per_trial": calls,
                **{f"{k}_us": round(v * 1e3, 3) for k, v in med.items()},
                "ref_ratio": round(med["ref_prof"] / med["ref"], 4),
                "cand_ratio": round(med["cand_prof"] / med["cand"], 4),
                "speedup_plain": round(med["ref"] / med["cand"], 4),
                "speedup_profiled": round(med["ref_prof"] / med["cand_prof"], 4),
                "profiler_ms": round(statistics.median(cost), 1),
                "kernels_recorded": int(statistics.median(kernels)),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            del ref, cand, sets
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(
            json.dumps({"device": torch.cuda.get_device_name(device), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
