"""Start one of this project's HTTP services as a child process, wait for its health endpoint,
stop it by PID.

Used by the tests, the benches and the tools for every service (`eval_server`, `buffer_server`),
so "is the server up" is always decided by the service's own health endpoint, never by a sleep,
and stopping a service only ever signals the process this module started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ServiceProcess", "free_port", "running_service", "start_service", "wait_healthy"]

_REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _tail(path: Path | None, chars: int = 4000) -> str:
    if path is None or not path.exists():
        return ""
    return path.read_text(errors="replace")[-chars:]


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes] | None,
    timeout_s: float,
    log_path: Path | None = None,
    *,
    health_path: str = "/health",
    name: str = "service",
) -> None:
    """Poll GET {url}{health_path} until 200; raise with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{url}{health_path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} at {url} not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}")
        time.sleep(0.1)


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


@dataclass
class ServiceProcess:
    """A service started by `start_service`: its URL, process and log file."""

    module: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 4000) -> str:
        return _tail(self.log_path, chars)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM this process (SIGKILL after `timeout_s`); returns its exit code. Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start_service(
    module: str,
    args: Sequence[str],
    workdir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 300.0,
    health_path: str = "/health",
    log_name: str | None = None,
    die_with_parent: bool = False,
) -> ServiceProcess:
    """Run `python -m MODULE --host HOST --port PORT ARGS` and wait until it is healthy.

    Its stdout and stderr are appended to WORKDIR/LOG_NAME (default `MODULE-PORT.log`).
    The repository root is put on PYTHONPATH so the child imports this checkout. If the service
    does not become healthy, it is stopped and RuntimeError carries the tail of its log. With
    `die_with_parent` (Linux) the service gets SIGTERM when the starting thread's process dies,
    however it dies (a Ray actor killed with SIGKILL leaves no server behind).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    log_path = workdir / (log_name or f"{module}-{port}.log")
    pythonpath = os.pathsep.join(p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    cmd = [sys.executable, "-m", module, "--host", host, "--port", str(port), *args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            preexec_fn=_term_with_parent if die_with_parent else None,  # noqa: PLW1509 - prctl only
        )
    service = ServiceProcess(module=module, url=f"http://{host}:{port}", proc=proc, log_path=log_path)
    try:
        wait_healthy(service.url, proc, startup_timeout_s, log_path, health_path=health_path, name=module)
    except BaseException:
        service.stop()
        raise
    return service


@contextlib.contextmanager
def running_service(
    module: str, args: Sequence[str], workdir: Path, **options: Any
) -> Iterator[ServiceProcess]:
    """`start_service` (same arguments and keyword options) as a context manager: yields the
    ServiceProcess, stops it on exit."""
    service = start_service(module, args, workdir, **options)
    try:
        yield service
    finally:
        service.stop()
