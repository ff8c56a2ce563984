"""An in-process CPU eval worker (eval_server.workers.worker.Worker) and its command-line arguments, for
tests that drive a Worker without starting its process."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval_server.workers.worker import Worker


def cpu_worker_args(workdir: Path) -> argparse.Namespace:
    return argparse.Namespace(
        worker_id=0, device="cpu", device_label="cpu", workdir=str(workdir), mem_cap_mb=0, threads=1,
        ref_cache="", gpu_lock="", hardening="{}",
    )  # fmt: skip


def cpu_worker(workdir: Path) -> Worker:
    return Worker(cpu_worker_args(workdir))
