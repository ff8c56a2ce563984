"""`python -m eval_server`: start the kernel evaluation service (Flask app on waitress).

Examples:
  python -m eval_server                          # all visible GPUs, else CPU interpreter mode
  python -m eval_server --devices 6,7            # one worker on each of GPUs 6 and 7
  python -m eval_server --devices cpu --cpu-workers 2 --port 18188
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from eval_server.isolation import sandbox
from eval_server.isolation.hardening import Hardening, gpu_memory_share
from eval_server.launch import cuda_visible_ids
from eval_server.workers.pool import DeviceSlot, PoolConfig, WorkerPool
from krl_common.cli import make_parser
from krl_common.http_json import add_network_args
from krl_common.shutdown import exit_port_in_use, interrupt_on_termination, is_address_in_use

log = logging.getLogger("eval_server")


def visible_gpus() -> list[int]:
    """Physical ids of the GPUs this process may use (honours CUDA_VISIBLE_DEVICES)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # count without creating a context
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA means CPU mode
        return []
    ids = cuda_visible_ids()
    return ids[:count] if ids is not None else list(range(count))


def gpu_names() -> dict[int, str]:
    """Physical GPU id -> product name from nvidia-smi (no CUDA context in the server process)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names = {}
    for line in out.splitlines():
        idx, _, name = line.partition(",")
        if idx.strip().isdigit():
            names[int(idx)] = name.strip()
    return names


def parse_slots(devices: str, workers_per_device: int, cpu_workers: int) -> list[DeviceSlot]:
    """'auto' | 'cpu' | comma-separated physical GPU ids -> one DeviceSlot per worker."""
    spec = devices.strip().lower()
    if spec == "auto":
        gpus = visible_gpus()
        if not gpus:
            return [DeviceSlot("cpu")] * cpu_workers
        names = gpu_names()
        return [DeviceSlot("cuda", g, names.get(g, "")) for g in gpus for _ in range(workers_per_device)]
    if spec == "cpu":
        return [DeviceSlot("cpu")] * cpu_workers
    ids: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            raise SystemExit(f"--devices: expected 'auto', 'cpu' or GPU ids like '0,1', got {devices!r}")
        ids.append(int(part))
    allowed = cuda_visible_ids()
    outside = [i for i in ids if allowed is not None and i not in allowed]
    if outside:  # each worker is pinned to a physical id: "0" would not mean CUDA's first visible GPU
        raise SystemExit(
            f"--devices {devices}: GPU {outside[0]} is not in CUDA_VISIBLE_DEVICES="
            f"{os.environ['CUDA_VISIBLE_DEVICES']}; --devices takes physical GPU ids (e.g. --devices "
            f"{allowed[0]}), or 'auto' for every visible GPU"
        )
    names = gpu_names()
    return [DeviceSlot("cuda", g, names.get(g, "")) for g in ids for _ in range(workers_per_device)]


def default_ref_cache() -> Path:
    """$XDG_CACHE_HOME (or ~/.cache)/triton-kernel-rl/ref_timing.sqlite: survives restarts."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "triton-kernel-rl" / "ref_timing.sqlite"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("eval_server", __doc__)
    add_network_args(p, env_prefix="EVAL_SERVER", port=18188, max_body_mb=1.0)
    dev = p.add_argument_group("workers")
    dev.add_argument(
        "--devices",
        default=os.environ.get("EVAL_SERVER_DEVICES", "auto"),
        help="'auto', 'cpu' or GPU ids '0,1'",
    )
    dev.add_argument(
        "--workers-per-device",
        type=int,
        default=1,
        help="workers per GPU; with 2, one evaluation's CPU work and correctness runs overlap the other's, "
        "while timing always holds the GPU exclusively (see gpu_lock.py); each evaluation may then "
        "allocate 0.95 / N of the GPU's memory (one that runs out is run again alone on the GPU)",
    )
    dev.add_argument(
        "--cpu-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="workers in CPU mode"
    )
    dev.add_argument(
        "--cpu-threads-per-worker", type=int, default=1, help="torch/OpenMP threads of each CPU-mode worker"
    )
    dev.add_argument(
        "--mps",
        choices=["on", "off"],
        default=os.environ.get("EVAL_SERVER_MPS", "on"),
        help="GPU workers: start this server's own CUDA MPS daemon, so each evaluation's judge and the "
        "candidate's process share the GPU without time-slicing (off: they time-slice, and timings carry "
        "~0.3 ms of hand-over and slowed kernels: not for rewards)",
    )
    dev.add_argument(
        "--max-queue", type=int, default=64, help="requests allowed to wait for a worker; beyond: 503"
    )
    dev.add_argument(
        "--timeout-s", type=float, default=None, help="default per-evaluation limit (GPU 180, CPU 300)"
    )
    dev.add_argument(
        "--max-timeout-s", type=float, default=900.0, help="cap on a request's own options.timeout_s"
    )
    dev.add_argument(
        "--mem-cap-gb", type=float, default=32.0, help="host memory cap per evaluation (0 = none)"
    )
    dev.add_argument(
        "--ref-cache",
        default=os.environ.get("EVAL_SERVER_REF_CACHE", str(default_ref_cache())),
        help="SQLite file caching reference timings across restarts ('none' disables)",
    )
    dev.add_argument(
        "--precision-policy",
        choices=["fp32", "tf32"],
        default=os.environ.get("EVAL_SERVER_PRECISION_POLICY", "fp32"),
        help="fp32: candidates of fp32 problems must be as accurate as fp32 math (tf32/bf16 dot rejected); "
        "tf32: tf32/fp16-precision operands allowed",
    )
    dev.add_argument(
        "--drift-tolerance",
        type=float,
        default=0.05,
        help="a cached reference timing is re-measured when a spot check differs by more than this",
    )
    dev.add_argument(
        "--reference-max-age",
        type=float,
        default=600.0,
        help="seconds a worker uses a problem's reference timing (measured by its first evaluation of the "
        "problem, before any candidate code) before it times the reference again",
    )
    dev.add_argument(
        "--timing-ci",
        type=float,
        default=0.001,
        help="adaptive timing: stop once the median's 95%% confidence interval is within +- this share "
        "(after at least 20 trials, at most the request's timing_trials); 0 = always timing_trials",
    )
    dev.add_argument(
        "--cuda-compile-timeout",
        type=float,
        default=120.0,
        help="seconds a CUDA candidate's load_inline builds may take (backend cuda); raise it on slow "
        "or shared build machines",
    )
    dev.add_argument(
        "--compile-unlocked",
        action="store_true",
        help="GPU, several workers per GPU: the candidate's process lets go of its shared hold of the GPU "
        "lock while Triton compiles, and compiles the second shape's kernels in its own checks (off by "
        "default: no measured gain, docs/BENCHMARKS.md)",
    )
    dev.add_argument(
        "--no-ptrace-guard",
        dest="ptrace_guard",
        action="store_false",
        help="keep the candidate's process's capabilities and the judge dumpable (by default the "
        "candidate's process drops every capability and the judge turns undumpable, so the candidate "
        "cannot ptrace the judge or write its memory); only for a system where that breaks evaluation",
    )
    dev.add_argument(
        "--runner-read-only",
        nargs="?",
        const="on",
        default="auto",
        choices=("auto", "on", "off"),
        help="the candidate's process sees every file system read-only but its worker's directory, the "
        "GPU lock files and the MPS pipes (a user and mount namespace of its own). auto (default): on "
        "where the kernel grants the namespaces, else off with a warning in the log (/health says "
        "which); on (or the bare flag): the server does not start without it; off",
    )
    dev.add_argument(
        "--workdir", default=None, help="worker dirs, logs and Triton caches (default: a new temp dir)"
    )
    p.add_argument("--log-level", default="INFO", help="logging level")
    return p


def hardening_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The Hardening fields the server's flags set, checked by Hardening itself before any worker
    starts (ValueError on a bad combination)."""
    overrides = {
        "drift_tolerance": args.drift_tolerance,
        "reference_max_age_s": args.reference_max_age,
        "timing_ci_rel": args.timing_ci,
        "precision_policy": args.precision_policy,
        "cuda_compile_timeout_s": args.cuda_compile_timeout,
        "compile_unlocked": args.compile_unlocked,
        "ptrace_guard": args.ptrace_guard,
        "runner_read_only": args.runner_read_only == "on",  # auto: resolved once the workdir exists
    }
    if args.workers_per_device > 1:
        overrides["gpu_memory_fraction"] = gpu_memory_share(args.workers_per_device)
    Hardening(**overrides)
    return overrides


def runner_read_only(mode: str, workdir: Path) -> bool:
    """Whether candidates' processes get read-only file systems: `auto` asks the kernel once
    (a container without user namespaces keeps a working server, and says so in the log)."""
    if mode != "auto":
        return mode == "on"
    refused = sandbox.confinement_refused([str(workdir)])
    if refused:
        log.warning(
            "--runner-read-only auto: the candidate's process keeps writable file systems (%s)", refused
        )
    return not refused


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        hardening = hardening_overrides(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    slots = parse_slots(args.devices, args.workers_per_device, args.cpu_workers)
    on_cpu = all(s.kind == "cpu" for s in slots)
    own_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kernel-eval-"))
    hardening["runner_read_only"] = runner_read_only(args.runner_read_only, workdir)
    config = PoolConfig(
        slots=slots,
        workdir=workdir,
        default_timeout_s=args.timeout_s or (300.0 if on_cpu else 180.0),
        max_timeout_s=args.max_timeout_s,
        max_queue=args.max_queue,
        mem_cap_mb=int(args.mem_cap_gb * 1024),
        cpu_threads_per_worker=args.cpu_threads_per_worker,
        ref_cache=None
        if args.ref_cache.lower() in ("", "none")
        else Path(args.ref_cache).expanduser().resolve(),
        hardening=hardening,
    )
    mps = None
    if args.mps == "on" and not on_cpu:
        from eval_server.isolation.mps import MpsDaemon, MpsUnavailable

        try:
            mps = MpsDaemon.start(workdir)
        except (MpsUnavailable, OSError, subprocess.SubprocessError) as exc:
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            sys.exit(
                f"eval_server: no CUDA MPS daemon ({exc}); pass --mps off to time without it (not for rewards)"
            )
        config.mps_env = mps.client_env()
    pool = WorkerPool(config)

    from waitress import create_server

    from eval_server.app import create_app

    info = {
        "mode": "cpu-interpreter" if on_cpu else "gpu",
        "devices": sorted({s.label for s in slots}),
        # what stands between a candidate's process and the judge (docs/EVAL_SERVER.md, Isolation)
        "isolation": {
            "ptrace_guard": hardening["ptrace_guard"],
            "runner_read_only": hardening["runner_read_only"],
            "mps": mps is not None,
        },
    }
    app = create_app(pool, max_body_bytes=int(args.max_body_mb * (1 << 20)), info=info)
    try:
        server = create_server(app, host=args.host, port=args.port, threads=len(slots) + args.max_queue + 4)
    except OSError as exc:
        if mps is not None:
            mps.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if is_address_in_use(exc):
            exit_port_in_use("eval_server", args.host, args.port, "pass --port N (launcher: EVAL_PORT)")
        raise

    # SIGTERM/SIGHUP stop the workers as Ctrl-C does (the `finally` below), not orphan them.
    interrupt_on_termination()
    pool.start()
    log.info(
        "eval_server listening on http://%s:%s with %d worker(s) on %s (workdir %s)",
        args.host,
        server.effective_port,
        len(slots),
        ", ".join(info["devices"]),
        workdir,
    )
    try:
        server.run()  # returns on Ctrl-C/SIGTERM/SIGHUP: waitress catches the KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        log.info("shutting down")
        server.close()
        pool.close()
        if mps is not None:
            mps.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
