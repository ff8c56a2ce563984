"""Shared fixtures: a real eval server started as a subprocess on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_eval_server(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, startup_timeout_s: float = 180.0
) -> Iterator[str]:
    """Start `python -m eval_server` on a free loopback port; yield its URL; stop it by PID."""
    port = free_port()
    log_path = tmp_path / f"eval-server-{port}.log"
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "eval_server", "--host", "127.0.0.1", "--port", str(port),
           "--workdir", str(tmp_path / f"work-{port}"), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO_ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"eval server exited early:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"eval server not healthy in {startup_timeout_s}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two CPU (Triton interpreter) workers."""
    with running_eval_server(tmp_path_factory.mktemp("evalsrv"), "--devices", "cpu", "--cpu-workers", "2") as url:
        yield url
