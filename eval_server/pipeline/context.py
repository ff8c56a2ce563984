"""What the phases of one evaluation share: its context (device, settings, GPU lock, caches, phase
clock), the reference as the reference phase leaves it, and the process-wide launch/thread recorders.

Separate from the phases so that each phase module depends on these types alone and never on
another phase's internals; the recorders live here so that there is exactly one of each (the
worker installs them in its warm parent, every phase that runs candidate code reads them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eval_server.checks.runtime import LaunchRecorder, ThreadStartRecorder
from eval_server.isolation.gpu_lock import GpuLock
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline import cuda_backend
from eval_server.pipeline.ref_cache import RefTimingCache

# Installed once in the warm parent and inherited by every forked evaluation.
LAUNCHES = LaunchRecorder()
THREADS = ThreadStartRecorder()


@dataclass
class EvalContext:
    """Where and how one evaluation runs; its phases read it and add their durations to `phases`."""

    device: torch.device
    device_label: str
    workdir: Path
    timing_enabled: bool  # False on CPU / interpreter workers
    ref_cache: RefTimingCache | None = None
    hardening: Hardening = field(default_factory=Hardening)
    versions: dict[str, str] = field(default_factory=dict)
    gpu_lock: GpuLock | None = None  # shared for GPU work, exclusive for timing (see gpu_lock.py)
    build_cache: Path | None = None  # backend "cuda": built extensions, kept across evaluations
    cuda: cuda_backend.Extensions | None = None  # backend "cuda": the candidate's loaded extensions
    phases: dict[str, float] = field(default_factory=dict)
    # names of the functions the candidate's source defines (static phase); None: not parsed
    candidate_functions: frozenset[str] | None = None
    # the reference's facts as the judge measured them (reference.judge_facts), which the
    # candidate's process then neither computes nor reads from a file another candidate's process
    # could have written; None: computed here (and cached in ref_cache, in-process evaluations)
    given_facts: dict[str, Any] | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - t0, 6)

    @contextmanager
    def gpu(self, exclusive: bool = False) -> Iterator[None]:
        """Hold the GPU lock (if any) around GPU work; the wait is reported as phase gpu_wait, the
        hold as gpu_held_shared or gpu_held_exclusive (what other evaluations of the GPU wait for)."""
        if self.gpu_lock is None:
            yield
            return
        lock = self.gpu_lock
        before = lock.waited_s
        with lock.exclusive() if exclusive else lock.shared():
            entered = lock.waited_s
            self._add("gpu_wait", entered - before)
            held = "gpu_held_exclusive" if exclusive else "gpu_held_shared"
            t0, paused0 = time.perf_counter(), lock.paused_s
            try:
                yield
            finally:
                # a shared hold let go while Triton compiled (compile_pause.py): neither the
                # pause nor the wait to take the lock back held the GPU from anyone
                paused = lock.paused_s - paused0
                resumed_wait = lock.waited_s - entered
                self._add("gpu_wait", resumed_wait)
                if paused:
                    self._add("compile_unlocked", paused)
                self._add(held, time.perf_counter() - t0 - paused - resumed_wait)

    def _add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = round(self.phases.get(phase, 0.0) + seconds, 6)


@dataclass
class Precision:
    ref_error: float  # normalized error of the fp32 (problem-dtype) reference against float64
    budget: float  # normalized error allowed under the precision policy, before the factor
    dtype: str  # dtype of the first floating output
    ref_scale: float = 0.0  # a lower bound of max|reference output| (finite floating elements)


@dataclass
class Reference:
    """What the reference phase leaves for the candidate phases (no output: see verification.py's
    _expected)."""

    module: Any
    model: torch.nn.Module
    init_inputs: list[Any]
    seeds: list[int]
    precision: Precision | None
    output_bytes: int
    pool: Any = None  # CUDA memory pool holding every reference allocation
    in_pool: Callable[[], Any] = contextlib.nullcontext
    input_bytes: int = 0  # one call's inputs (physics floor)
    flops: int = 0  # matmul/conv/attention FLOPs of one forward (physics floor)
    kernels: dict[str, Any] | None = (
        None  # its profiled forward's device time (kernel_time.reference_kernels)
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
