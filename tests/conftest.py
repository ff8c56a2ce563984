"""Shared fixtures: a real eval server started as a subprocess on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from eval_server.launch import free_port, running_server
from eval_server.pipeline.cuda_backend import nvcc_path

__all__ = ["free_port", "needs_nvcc", "running_eval_server"]

# Candidate and problem sources sent to the server as text (tests/exploit_cases.py), never tests.
collect_ignore = ["exploit_corpus"]

needs_nvcc = pytest.mark.skipif(
    nvcc_path() is None, reason="no CUDA compiler (nvcc) on this machine: the compile check cannot run"
)


@contextlib.contextmanager
def running_eval_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A server whose reference cache is in `tmp_path` unless `args` name one: never the user's."""
    if "--ref-cache" not in args:
        args = (*args, "--ref-cache", str(tmp_path / "ref_cache.sqlite"))
    with running_server(tmp_path, args, env=env, startup_timeout_s=180.0) as url:
        yield url


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two CPU (Triton interpreter) workers."""
    with running_eval_server(
        # no compile limit a loaded machine trips: the CUDA candidates take ~50 s each alone
        tmp_path_factory.mktemp("evalsrv"),
        "--devices",
        "cpu",
        "--cpu-workers",
        "2",
        "--cuda-compile-timeout",
        "3600",
    ) as url:
        yield url
