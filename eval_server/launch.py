"""Start an eval server as a child process, wait for /health, stop it by PID.

One definition used by the sample runner (tools/eval_samples.py), the tests and the benches,
so "is the server up" is always decided by its health endpoint, never by a sleep. The generic
parts (free port, health polling, start/stop by PID) live in `krl_common.service`, shared with
the rollout buffer server; this module keeps the eval-server-specific defaults.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from krl_common import service
from krl_common.service import free_port

__all__ = ["cuda_visible_ids", "first_gpu", "free_port", "running_server", "wait_healthy"]


def cuda_visible_ids() -> list[int] | None:
    """CUDA_VISIBLE_DEVICES's physical GPU ids; None when it is unset, empty or not a list of ids
    (UUIDs): then it says nothing about physical ids."""
    ids = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [int(v) for v in ids] if ids and all(v.isdigit() for v in ids) else None


def first_gpu() -> str:
    """The first GPU this process may use, as --devices takes it (a physical id): the first of
    CUDA_VISIBLE_DEVICES's ids when it lists ids, else "0". `CUDA_VISIBLE_DEVICES=1 pytest ...`
    then runs a test's server on GPU 1."""
    return str((cuda_visible_ids() or [0])[0])


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float, log_path: Path | None = None
) -> None:
    """Poll GET /health until 200; raise with the log tail if the process dies or time runs out."""
    service.wait_healthy(url, proc, timeout_s, log_path, name="eval server")


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
    port = port or free_port(host)
    with service.running_service(
        "eval_server",
        ["--workdir", str(workdir / f"server-{port}"), *args],
        workdir,
        host=host,
        port=port,
        env=env,
        startup_timeout_s=startup_timeout_s,
        log_name=f"eval-server-{port}.log",
    ) as svc:
        yield svc.url
