"""Undo persisting-L2 state before every timed trial (FIELD_NOTES, exploit classes of 2026).

An access-policy window (`cudaStreamSetAttribute(..., accessPolicyWindow)`) with a persisting
set-aside (`cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n)`) keeps a kernel's inputs in
L2 across calls, and the L2 flush of timing.py (writing a buffer) cannot evict persisting lines:
a reported kernel measured 3530 GB/s on an 864 GB/s card. So before each trial's flush the
set-aside goes back to 0 and every persisting line back to normal (what NVIDIA/nvbench #458 does).

torch exposes neither call, so they go through ctypes to the CUDA runtime library torch itself
loaded (found in /proc/self/maps: the same library instance, hence the same runtime state), or
the driver API (`libcuda.so.1`, whose limit enum has the same value) when torch links the
runtime statically. A missing library or symbol, or an error code, is not fatal: the reset is
defense in depth, so `STATE.note` says why it could not be done and the evaluation reports it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass

LIMIT_PERSISTING_L2 = 6  # cudaLimitPersistingL2CacheSize == CU_LIMIT_PERSISTING_L2_CACHE_SIZE


@dataclass
class _Api:
    get_limit: Callable[[], int]  # current set-aside in bytes
    set_limit: Callable[[int], int]  # returns the CUDA error code (0 = success)
    reset_lines: Callable[[], int]  # every persisting line back to normal; error code
    source: str  # which library, for notes


@dataclass
class ResetState:
    """What the resets of this process saw (the judge resets before every window: judge/gpu_calls.py)."""

    note: str | None = None  # why a reset could not be done (None: every reset succeeded)
    resets: int = 0
    found_limit_bytes: int = 0  # largest set-aside found before a reset (0: nobody set one)
    # What the first reset of the process found: the context's own default, read during the
    # reference's timing, before any candidate code exists in the process (an H200 reported
    # 11796480 bytes there). Reset like any other, but not something a candidate did.
    initial_limit_bytes: int | None = None


STATE = ResetState()
# Resolved once per process, kept in a dict (no module global is rebound after start-up: the
# evaluator's module namespaces are snapshotted against patching, runtime_checks.py).
_RESOLVED: dict[str, _Api | None] = {}


def loaded_libraries(prefix: str, maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the shared libraries mapped into this process whose file name starts with `prefix`."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(prefix) and ".so" in os.path.basename(p))


def _bind(lib: ctypes.CDLL, get_name: str, set_name: str, reset_name: str, source: str) -> _Api:
    """The three calls of one library (runtime and driver API have the same shapes)."""
    get, set_, reset_lines = getattr(lib, get_name), getattr(lib, set_name), getattr(lib, reset_name)
    get.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    set_.argtypes = [ctypes.c_int, ctypes.c_size_t]
    reset_lines.argtypes = []

    def get_limit() -> int:
        value = ctypes.c_size_t(0)
        err = get(ctypes.byref(value), LIMIT_PERSISTING_L2)
        return int(value.value) if err == 0 else -int(err)

    return _Api(get_limit, lambda n: int(set_(LIMIT_PERSISTING_L2, n)), lambda: int(reset_lines()), source)


def _runtime_api(path: str) -> _Api:
    # Already loaded by torch: dlopen hands back the same library instance, with its state.
    lib = ctypes.CDLL(path)
    names = ("cudaDeviceGetLimit", "cudaDeviceSetLimit", "cudaCtxResetPersistingL2Cache")
    return _bind(lib, *names, os.path.basename(path))


def _driver_api() -> _Api:
    lib = ctypes.CDLL("libcuda.so.1")
    return _bind(lib, "cuCtxGetLimit", "cuCtxSetLimit", "cuCtxResetPersistingL2Cache", "libcuda.so.1")


def api() -> _Api | None:
    """The reset functions, resolved once per process; None (with STATE.note) when unavailable."""
    if "api" in _RESOLVED:
        return _RESOLVED["api"]
    found: _Api | None = None
    tried: list[str] = []
    for path in loaded_libraries("libcudart"):
        try:
            found = _runtime_api(path)
            break
        except (OSError, AttributeError) as exc:
            tried.append(f"{os.path.basename(path)}: {exc}")
    if found is None:
        try:
            found = _driver_api()
        except (OSError, AttributeError) as exc:
            tried.append(f"driver API: {exc}")
    if found is None:
        STATE.note = "persisting-L2 reset unavailable (" + ("; ".join(tried) or "no CUDA library") + ")"
    _RESOLVED["api"] = found
    return found


def reset() -> None:
    """Set-aside to 0 (only when set: the query is cheaper than the set) and persisting lines to
    normal. Call outside timed regions, before the L2 flush. Never raises."""
    funcs = api()
    if funcs is None:
        return
    limit = funcs.get_limit()
    if limit < 0:
        STATE.note = f"cannot read the persisting-L2 limit through {funcs.source} (CUDA error {-limit})"
        return
    if STATE.initial_limit_bytes is None:
        STATE.initial_limit_bytes = limit
    else:
        STATE.found_limit_bytes = max(STATE.found_limit_bytes, limit)
    err = funcs.set_limit(0) if limit > 0 else 0
    err = err or funcs.reset_lines()
    if err:
        STATE.note = f"persisting-L2 reset through {funcs.source} failed with CUDA error {err}"
        return
    STATE.resets += 1
