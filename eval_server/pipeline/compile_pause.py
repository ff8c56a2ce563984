"""Let go of the shared GPU hold while Triton compiles a kernel.

A fresh candidate's first launch compiles its kernels (~0.2-0.3 s of host work each, 1x H200),
and it ran inside the runner's shared hold of the GPU lock (gpu_lock.py): with several workers on
one GPU, every other evaluation's timing waited for compiles that use no GPU. Triton calls
`knobs.runtime.jit_cache_hook` right before it compiles (an in-memory cache miss) and
`jit_post_compile_hook` right after; the first pauses the hold, the second takes it back before
the launch. A compile that raises never reaches the second hook: the hold's end closes the pause
(GpuLock._hold), and GPU work a candidate runs after catching its own compile error runs unheld;
the lock keeps honest evaluations apart, it is not a boundary against a candidate (one can always
keep the GPU busy from a thread).

Installed in the runner before the candidate is imported; a candidate that replaces the hooks
only loses the pause. A no-op where Triton has no such knobs.
"""

from __future__ import annotations

from typing import Any

from eval_server.isolation.gpu_lock import GpuLock


def install(lock: GpuLock) -> bool:
    """Hook `lock`'s pause and resume around Triton's compiles; False where Triton cannot."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if not all(hasattr(runtime, hook) for hook in ("jit_cache_hook", "jit_post_compile_hook")):
        return False

    def before_compile(*args: Any, **kwargs: Any) -> bool:
        lock.pause()
        return False  # never skip the compile

    def after_compile(*args: Any, **kwargs: Any) -> None:
        lock.resume()

    runtime.jit_cache_hook = before_compile
    runtime.jit_post_compile_hook = after_compile
    return True
