"""Fixtures shared by the GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eval_server.launch import first_gpu, running_server


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An eval server with one worker on the first visible GPU, one per test module."""
    with running_server(tmp_path_factory.mktemp("gpu"), ["--devices", first_gpu()]) as url:
        yield url


@pytest.fixture(scope="module")
def two_worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An eval server with two workers on the first visible GPU and its own reference cache, one per test module
    (CUDA builds run in one worker while the other evaluates)."""
    tmp = tmp_path_factory.mktemp("gpu-two-workers")
    args = ["--devices", first_gpu(), "--workers-per-device", "2", "--ref-cache", str(tmp / "ref.sqlite")]
    with running_server(tmp, args) as url:
        yield url
