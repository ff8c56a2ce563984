"""Where the evaluation-to-evaluation spread of short kernels comes from (A/A noise).

Each evaluation is a fresh process, and a 50-150 us kernel's median moves between processes
while it is stable within one. This times the same case in `--procs` fresh processes per
variant and reports, per process, three views of the same candidate call:

- `evaluator`: `eval_server.pipeline.timing.time_gpu` as the evaluator runs it (flush, device sync, events);
- `gpu_only`: start event, call, end event queued behind a GPU sleep, so the host is ahead and
  the interval is the GPU's own time (launch latency excluded);
- `host_us`: host time of one call without synchronising (Python + launch overhead);

and the reference's `evaluator` median in the same process. Variants: `free` (the scheduler
places the process) and `pinned` (sched_setaffinity to one CPU local to the GPU before CUDA
starts). If `gpu_only` is stable and `evaluator` is not, the spread is host-side.

  python3 bench/timing_spread_probe.py --cases layernorm_large,small_elementwise --procs 8 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def local_cpus(device_index: int) -> list[int]:
    """CPUs on the GPU's NUMA node (from sysfs), or every CPU this process may use."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    bus = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    path = Path("/sys/bus/pci/devices") / bus / "local_cpulist"
    cpus: list[int] = []
    if path.exists():
        for part in path.read_text().strip().split(","):
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    allowed = os.sched_getaffinity(0)
    return [c for c in cpus if c in allowed] or sorted(allowed)


def _import(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpu_only(model: Any, sets: list, flush: Any) -> tuple[float, float]:
    """Median GPU-only ms of a call (events queued behind a GPU sleep, so the host is ahead)
    and median host us of the call itself, over 55 calls after 5 warm ones."""
    import time

    import torch

    gpu_only, host = [], []
    for i in range(60):
        x = sets[i % len(sets)]
        flush.zero_()
        torch.cuda._sleep(2_000_000)  # ~1 ms: the host queues what follows before the GPU gets there
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        model(*x)
        host.append((time.perf_counter() - t0) * 1e6)
        end.record()
        end.synchronize()
        gpu_only.append(start.elapsed_time(end))
    return statistics.median(gpu_only[5:]), statistics.median(host[5:])


def child(case: str, variant: str, cpu: int | None) -> dict:
    if variant == "pinned" and cpu is not None:
        os.sched_setaffinity(0, {cpu})

    import torch

    from eval_server.pipeline.timing import l2_flush_buffer, time_gpu

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    # Imported from their files (Triton reads a kernel's source from its file).
    ns_ref = vars(_import(Path(__file__).parent / "problems" / f"{case}.py"))
    ns_cand = vars(_import(Path(__file__).parent / "candidates" / f"{case}__triton.py"))
    with torch.device(device):
        torch.manual_seed(0)
        ref = ns_ref["Model"](*ns_ref["get_init_inputs"]())
        cand = ns_cand["ModelNew"](*ns_ref["get_init_inputs"]())
        cand.load_state_dict(ref.state_dict())
        sets = [ns_ref["get_inputs"]() for _ in range(3)]
    flush = l2_flush_buffer(device)
    out: dict = {"case": case, "variant": variant, "pid": os.getpid()}
    with torch.no_grad():
        out["ref_ms"] = time_gpu(ref, sets, trials=100, warmup=3, device=device, flush=flush).median_ms
        out["cand_ms"] = time_gpu(cand, sets, trials=100, warmup=3, device=device, flush=flush).median_ms
        out["cand_gpu_only_ms"], out["cand_host_us"] = _gpu_only(cand, sets, flush)
        out["ref_gpu_only_ms"], _ = _gpu_only(ref, sets, flush)
    out["input_ptr_mod_2mb"] = [t.data_ptr() % (2 << 20) for s in sets for t in s if torch.is_tensor(t)]
    out["cpus_allowed"] = len(os.sched_getaffinity(0))
    try:
        import psutil

        out["cpu_now"] = psutil.Process().cpu_num()
    except Exception:  # noqa: BLE001 - optional detail
        pass
    return out


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="layernorm_large,small_elementwise")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--variants", default="free,pinned")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", nargs=3, metavar=("CASE", "VARIANT", "CPU"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        case, variant, cpu = args.child
        print(json.dumps(child(case, variant, int(cpu) if cpu != "-" else None)))
        return 0
    import torch

    cpus = local_cpus(0)
    print(f"GPU-local CPUs: {cpus}", flush=True)
    torch.cuda.empty_cache()
    rows = []
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            for k in range(args.procs):
                cpu = str(cpus[k % len(cpus)]) if variant == "pinned" else "-"
                res = subprocess.run(
                    [sys.executable, __file__, "--child", case, variant, cpu],
                    capture_output=True, text=True, timeout=300, check=False,
                )  # fmt: skip
                if res.returncode != 0:
                    print(res.stderr[-2000:], flush=True)
                    continue
                row = json.loads(res.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    keys = ("cand_ms", "ref_ms", "cand_gpu_only_ms", "ref_gpu_only_ms", "cand_host_us")
    print(
        f"{'case':20s} {'variant':8s} "
        + " ".join(f"{k + ' CV%':>22s}" for k in keys)
        + f" {'speedup CV%':>12s}"
    )
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            sel = [r for r in rows if r["case"] == case and r["variant"] == variant]
            if not sel:
                continue
            cells = [
                f"{statistics.median(r[k] for r in sel):10.4f} {100 * cv([r[k] for r in sel]):10.2f}"
                for k in keys
            ]
            speedups = [r["ref_ms"] / r["cand_ms"] for r in sel]
            print(
                f"{case:20s} {variant:8s} "
                + " ".join(f"{c:>22s}" for c in cells)
                + f" {100 * cv(speedups):12.2f}"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
