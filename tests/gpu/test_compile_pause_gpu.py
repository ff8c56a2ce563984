"""A fresh Triton kernel's compile lets go of the runner's shared GPU hold (compile_pause.py), on
the GPU machine's Triton: its JIT calls the hooks around a real compile, not around a launch of a
kernel it has compiled.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_compile_pause_gpu.py -v`.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from triton import knobs  # noqa: E402

from eval_server.isolation.gpu_lock import GpuLock  # noqa: E402
from eval_server.pipeline import compile_pause  # noqa: E402

KERNEL = """
import triton
import triton.language as tl

@triton.jit
def add_one_{tag}(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + {tag_value}, mask=m)
"""


def _fresh_kernel(tmp_path: Path):
    """A kernel no cache has seen (its source carries a random constant)."""
    tag = secrets.token_hex(6)
    path = tmp_path / f"fresh_{tag}.py"
    path.write_text(KERNEL.format(tag=tag, tag_value=float(int(tag, 16) % 1000)))
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(path.stem)
    finally:
        sys.path.remove(str(tmp_path))
    return getattr(module, f"add_one_{tag}")


def test_a_fresh_compile_pauses_the_hold_and_the_launch_has_it_back(tmp_path: Path) -> None:
    path = str(tmp_path / "gpu-0.lock")
    lock = GpuLock(path)
    saved = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    x = torch.zeros(1000, device="cuda")
    try:
        assert compile_pause.install(lock)
        kernel = _fresh_kernel(tmp_path)
        with lock.shared():
            kernel[(1,)](x, x.numel(), BLOCK=1024)
            assert lock.mode == "shared" and lock._paused_at is None  # held again after the compile
            first = lock.paused_s
            kernel[(1,)](x, x.numel(), BLOCK=1024)  # compiled: no pause
            torch.cuda.synchronize()
        assert first > 0.01, first  # a real compile of a new kernel: tens of ms at least
        assert lock.paused_s == first
        assert float(x[0]) > 0
    finally:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved
        lock.close()
