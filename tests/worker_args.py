"""The command-line arguments of an in-process CPU eval worker (eval_server.worker.Worker), for
tests that drive a Worker without starting its process."""

from __future__ import annotations

import argparse
from pathlib import Path


def cpu_worker_args(workdir: Path) -> argparse.Namespace:
    return argparse.Namespace(
        worker_id=0, device="cpu", device_label="cpu", workdir=str(workdir), mem_cap_mb=0, threads=1,
        ref_cache="", gpu_lock="", hardening="{}",
    )  # fmt: skip
