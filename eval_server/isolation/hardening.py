"""The server-level knobs of the evaluation (what `python -m eval_server` flags set), with their
checks. Free of torch so the server process validates its flags without loading it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hardening:
    """Server-level knobs of the anti-cheat and timing-fidelity machinery."""

    spot_check_trials: int = 20  # reference trials timed in every evaluation when the cache has an entry
    drift_tolerance: float = 0.05  # spot check vs cache disagreement that forces a re-measure
    # a reference timing a worker keeps (judge/known.py) is re-timed once it is older than this
    reference_max_age_s: float = 600.0
    # Re-timings of a candidate whose timing saw escaped work; rejected when every one does.
    escape_retimes: int = 2
    # Adaptive timing (judge/timing.time_model): at least this many windows, then stop once the
    # median's 95 % confidence interval is within +- timing_ci_rel of it; the request's
    # timing_trials is the maximum. timing_ci_rel 0 times exactly timing_trials.
    timing_min_trials: int = 20
    timing_ci_rel: float = 0.001
    # Precision: the candidate's normalized error against float64 (max abs diff / max abs value)
    # must stay under max(floor[dtype], factor x the budget of the policy); see pipeline/reference.precision_baseline.
    precision_policy: str = "fp32"  # "fp32" (strict) or "tf32" (10-bit-mantissa inputs allowed)
    precision_floor: dict[str, float] = field(
        default_factory=lambda: {"float32": 5e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-12}
    )
    precision_factor: float = 20.0  # fp32 policy: x the reference's own float64 error
    precision_factor_tf32: float = 4.0  # tf32 policy: x the error of 10-bit-mantissa inputs
    profile_kernels: bool = True  # GPU: CUPTI check that only the candidate's Triton kernels computed
    cuda_compile_timeout_s: float = 120.0  # backend "cuda": load_inline builds (cuda_backend.py)
    # Share of the GPU's memory one evaluation may allocate through torch (the server sets
    # (1 - 0.05) / workers per device): evaluations that share a GPU cannot push each other
    # out of memory, so an out-of-memory error depends on the candidate alone.
    gpu_memory_fraction: float = 1.0
    # GPU: the runner lets go of its shared GPU hold while Triton compiles (pipeline/compile_pause.py)
    # and warms the second shape's kernels in its first layer (shapes.warm); off until measured
    compile_unlocked: bool = False
    # The candidate's process drops every capability (no_new_privs) and the judge turns
    # undumpable after forking it: the runner can neither ptrace the judge nor write its memory
    # through /proc (isolation/sandbox.py); off only for a GPU driver that would refuse it
    ptrace_guard: bool = True
    # The candidate's process sees every file system read-only but its worker's directory, the
    # GPU lock files and the MPS pipes (sandbox.confine_writes);
    # the server's `--runner-read-only auto` turns it on where the kernel grants the namespaces
    runner_read_only: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if not 0 < self.reference_max_age_s < float("inf"):
            raise ValueError(
                f"reference_max_age_s (--reference-max-age) must be > 0 and finite, got {self.reference_max_age_s}"
            )
        if self.cuda_compile_timeout_s <= 0:
            raise ValueError(
                f"cuda_compile_timeout_s (--cuda-compile-timeout) must be > 0, got {self.cuda_compile_timeout_s}"
            )


def gpu_memory_share(workers_per_device: int) -> float:
    """Share of a GPU's memory for each of its evaluations: equal parts of all but 5 % (the CUDA
    contexts of the running and the spare evaluation processes live outside torch's allocator)."""
    return round(0.95 / workers_per_device, 4)
