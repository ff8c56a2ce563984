"""The build cache's premise, with a real torch extension build (C++ only, so it runs on a CPU
machine): what one process built with load_inline into a key's directory, a fresh process loads
from there without rebuilding. The CUDA backend relies on it: the compile process builds outside
the GPU lock, the evaluation process only loads (eval_server/pipeline/cuda_backend.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from eval_server.pipeline import cuda_backend
from eval_server.pipeline.cuda_backend import Extensions, InlineCall

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("ninja") is None or shutil.which(os.environ.get("CXX", "c++")) is None,
        reason="torch builds extensions with ninja and a C++ compiler; one of them is missing",
    ),
]


def _build_in_child(call: InlineCall, build_dir: Path) -> None:
    pid = os.fork()
    if pid == 0:  # the compile process's part: build (and import) in another process
        code = 1
        try:
            call.load(build_dir)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_build_from_another_process_is_loaded_without_rebuilding(tmp_path: Path):
    call = InlineCall.bind(
        (),
        {
            "name": "cache_probe",
            "cpp_sources": "int64_t twice(int64_t x) { return 2 * x; }",
            "functions": ["twice"],
        },
    )
    build_dir = tmp_path / call.key()
    _build_in_child(call, build_dir)
    assert cuda_backend.built(build_dir)
    library = build_dir / "cache_probe.so"
    stamp = library.stat().st_mtime_ns
    t0 = time.perf_counter()
    module = Extensions(tmp_path)._load(call)
    assert module.twice(21) == 42
    assert library.stat().st_mtime_ns == stamp, "the extension was rebuilt"
    assert time.perf_counter() - t0 < 5.0
