"""Fixtures shared by the GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eval_server.launch import running_server


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An eval server with one worker on GPU 0, one per test module."""
    with running_server(tmp_path_factory.mktemp("gpu"), ["--devices", "0"]) as url:
        yield url


@pytest.fixture(scope="module")
def two_worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An eval server with two workers on GPU 0 and its own reference cache, one per test module
    (CUDA builds run in one worker while the other evaluates)."""
    tmp = tmp_path_factory.mktemp("gpu-two-workers")
    args = ["--devices", "0", "--workers-per-device", "2", "--ref-cache", str(tmp / "ref.sqlite")]
    with running_server(tmp, args) as url:
        yield url
