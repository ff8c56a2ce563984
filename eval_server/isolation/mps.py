"""The server's own CUDA MPS control daemon, so a judge and its runner share the GPU without
time-slicing.

Two processes' CUDA contexts time-slice on one GPU: with the judge waiting on a stream memory
operation while the runner computes, each window took ~290 us of hand-over and kernels ran at
about half speed (relu of 4 GiB 4.24 ms vs 2.02 ms in-process, a 4096 fp32 GEMM 6.30 vs 2.71
ms, H200). Under MPS the hand-over was 13-20 us and the same kernels 2.04 and 2.69 ms
(bench/judge_protocol.py, docs/BENCHMARKS.md). The daemon is this server's: its pipe and log
directories live in the server's work directory, only processes given CUDA_MPS_PIPE_DIRECTORY
(the workers) connect to it, and it is stopped through that pipe directory, never by name.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("eval_server")
CONTROL = "nvidia-cuda-mps-control"


class MpsUnavailable(RuntimeError):
    """No MPS control daemon could be started (binary missing, or it refused)."""


@dataclass(frozen=True)
class MpsDaemon:
    pipe_dir: Path
    log_dir: Path
    binary: str

    def client_env(self) -> dict[str, str]:
        """What a process needs in its environment to be this daemon's client."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _env(self) -> dict[str, str]:
        # Every GPU visible to the daemon, so a worker's CUDA_VISIBLE_DEVICES (a physical id)
        # means the same device to the daemon as to the driver.
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        return {**env, **self.client_env()}

    @classmethod
    def start(cls, workdir: Path) -> MpsDaemon:
        binary = shutil.which(CONTROL)
        if binary is None:
            raise MpsUnavailable(f"{CONTROL} is not on PATH")
        daemon = cls(workdir / "mps-pipe", workdir / "mps-log", binary)
        daemon.pipe_dir.mkdir(parents=True, exist_ok=True)
        daemon.log_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([binary, "-d"], env=daemon._env(), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise MpsUnavailable(
                f"{CONTROL} -d exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
            )
        log.info("MPS control daemon started (pipe directory %s)", daemon.pipe_dir)
        return daemon

    def stop(self) -> None:
        """Ask this daemon (by its pipe directory) to quit; it stops its servers first."""
        try:
            subprocess.run(
                [self.binary], input="quit\n", env=self._env(), capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("MPS control daemon did not stop cleanly: %s", exc)


@contextmanager
def client_env(workdir: Path) -> Iterator[dict[str, str]]:
    """A daemon of its own under `workdir` for as long as the block runs; yields the environment
    its clients (GPU workers, a judge harness) need."""
    daemon = MpsDaemon.start(workdir)
    try:
        yield daemon.client_env()
    finally:
        daemon.stop()
