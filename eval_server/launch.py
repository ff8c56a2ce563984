"""Start an eval server as a child process, wait for /health, stop it by PID.

One definition used by the sample runner (tools/eval_samples.py), the tests and the benches,
so "is the server up" is always decided by its health endpoint, never by a sleep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

_REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float, log_path: Path | None = None
) -> None:
    """Poll GET /health until 200; raise with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"eval server exited with code {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"eval server at {url} not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}"
            )
        time.sleep(0.2)


def _tail(path: Path | None, chars: int = 4000) -> str:
    if path is None or not path.exists():
        return ""
    return path.read_text(errors="replace")[-chars:]


@contextlib.contextmanager
def running_server(
    workdir: Path,
    args: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 300.0,
) -> Iterator[str]:
    """Run `python -m eval_server ARGS` on a free port; yield its URL; SIGTERM it (then SIGKILL) on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    log_path = workdir / f"eval-server-{port}.log"
    pythonpath = os.pathsep.join(p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "eval_server",
        "--host",
        host,
        "--port",
        str(port),
        "--workdir",
        str(workdir / f"server-{port}"),
        *args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://{host}:{port}"
    try:
        wait_healthy(url, proc, startup_timeout_s, log_path)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
