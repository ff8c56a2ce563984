"""The server-level knobs of the evaluation (what `python -m eval_server` flags set), with their
checks. Free of torch so the server process validates its flags without loading it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hardening:
    """Server-level knobs of the anti-cheat and timing-fidelity machinery."""

    timing_input_sets: int = 3  # input sets rotated during timing
    spot_check_trials: int = 20  # reference trials timed in every evaluation when the cache has an entry
    drift_tolerance: float = 0.05  # spot check vs cache disagreement that forces a re-measure
    excessive_speedup: float = 10.0  # above this, re-verify and re-time before reporting
    # Re-timings of a candidate whose timing saw escaped work; rejected when every one does.
    escape_retimes: int = 2
    # Adaptive timing (timing.time_gpu): at least this many trials, then stop once the median's
    # 95 % confidence interval is within +- timing_ci_rel of it; the request's timing_trials is
    # the maximum. timing_ci_rel 0 times exactly timing_trials.
    timing_min_trials: int = 20
    timing_ci_rel: float = 0.001
    # Problems whose reference trial (calls per trial x median) takes at least long_trial_ms,
    # a fact of the problem read from its cached timing: the reference's spot check times
    # long_trial_trials trials and the candidate's adaptive minimum is long_trial_trials. A trial
    # that long varies by ~0.05 % (BENCHMARKS.md), and the confidence-interval rule still
    # decides when the candidate's timing stops; shorter problems keep the figures above.
    long_trial_ms: float = 1.0
    long_trial_trials: int = 10
    # The interval such a problem's candidate timing stops at: its reference's spot check is 10
    # trials without the interval rule, and +-0.1 % ran GEMM's candidate to 78 trials on average
    # (softmax and sum now and then to 40-100) for speedups that agreed with +-0.5 % to 0.15 %
    # (H200, docs/BENCHMARKS.md, 2026-11-27).
    long_trial_ci_rel: float = 0.005
    # Warm-up before timed trials (timing._warm_up): the reference's timing is the first GPU
    # timing of the process, on a GPU that may have idled, and warms for warmup_ms; the
    # candidate's follows the reference's timing and the correctness trials (the GPU busy
    # throughout) and warms for at least warmup_busy_ms, until its per-call time has settled,
    # at most warmup_ms. warmup_busy_ms = warmup_ms: both fixed (the method before 2026-11-25).
    warmup_ms: float = 200.0
    warmup_busy_ms: float = 20.0
    # The reference's timing warms like the candidate's (warmup_busy_ms) when a timing on this GPU
    # ended at most warm_gap_s ago (EvalContext.gpu_busy_at: back-to-back evaluations); 0: never.
    warm_gap_s: float = 1.0
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

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if not 0 <= self.long_trial_ci_rel < 1:
            raise ValueError(
                f"long_trial_ci_rel (--long-trial-ci) must be in [0, 1), got {self.long_trial_ci_rel}"
            )
        if self.long_trial_trials < 2 or self.long_trial_ms <= 0:
            raise ValueError(
                "need long_trial_trials >= 2 and long_trial_ms > 0, "
                f"got {self.long_trial_trials} and {self.long_trial_ms}"
            )
        if self.cuda_compile_timeout_s <= 0:
            raise ValueError(
                f"cuda_compile_timeout_s (--cuda-compile-timeout) must be > 0, got {self.cuda_compile_timeout_s}"
            )
        if self.warm_gap_s < 0:
            raise ValueError(f"warm_gap_s (--warm-gap-s) must be >= 0, got {self.warm_gap_s}")
        if not 0 <= self.warmup_busy_ms <= self.warmup_ms:
            raise ValueError(
                "need 0 <= warmup_busy_ms <= warmup_ms (--warmup-busy-ms <= --warmup-ms), "
                f"got {self.warmup_busy_ms} and {self.warmup_ms}"
            )


def gpu_memory_share(workers_per_device: int) -> float:
    """Share of a GPU's memory for each of its evaluations: equal parts of all but 5 % (the CUDA
    contexts of the running and the spare evaluation processes live outside torch's allocator)."""
    return round(0.95 / workers_per_device, 4)
