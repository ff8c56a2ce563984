"""The one definition of the evaluation request and result (the JSON that crosses HTTP).

Both sides of every boundary (HTTP app, worker pipe, async client, episode) use these
dataclasses, so a field is added or renamed in exactly one place. Validation is hand-written
(no pydantic) because the GPU machines and the slime image do not all ship it; every error names
the offending field so a 400 tells the caller exactly what to fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from krl_common.validation import ValidationError
from krl_common.validation import check_type as _check_type
from krl_common.validation import reject_unknown as _reject_unknown

# Closed set of result statuses. Order is documentation only.
STATUS_OK = "ok"  # compiled, correct on every trial, passed every check
STATUS_COMPILE_ERROR = "compile_error"  # syntax/import error, no ModelNew, Triton compile failure
STATUS_RUNTIME_ERROR = "runtime_error"  # exception while constructing or running ModelNew
STATUS_INCORRECT = "incorrect"  # ran, but outputs differ from the reference (or wrong shape/dtype)
STATUS_REJECTED = "rejected"  # a static or runtime anti-cheat check fired
STATUS_TIMEOUT = "timeout"  # hard wall-clock limit hit; the evaluation process was killed
STATUS_CRASHED = "crashed"  # evaluation process died (signal, os._exit, memory cap)
STATUS_REFERENCE_ERROR = (
    "reference_error"  # the problem itself failed to load or run: not the candidate's fault
)
STATUS_SERVER_ERROR = "server_error"  # internal failure of the evaluator
# this worker cannot run the request (backend "cuda" without a GPU or without a CUDA toolchain):
# not the candidate's fault, no reward signal
STATUS_UNSUPPORTED = "unsupported"

STATUSES: tuple[str, ...] = (
    STATUS_OK,
    STATUS_COMPILE_ERROR,
    STATUS_RUNTIME_ERROR,
    STATUS_INCORRECT,
    STATUS_REJECTED,
    STATUS_TIMEOUT,
    STATUS_CRASHED,
    STATUS_REFERENCE_ERROR,
    STATUS_SERVER_ERROR,
    STATUS_UNSUPPORTED,
)

# Statuses that are not the candidate's doing (the problem, the evaluator, the worker's device):
# no reward signal, and nothing for the model to fix.
EVALUATOR_STATUSES: tuple[str, ...] = (STATUS_REFERENCE_ERROR, STATUS_SERVER_ERROR, STATUS_UNSUPPORTED)

# How the candidate writes its kernels: Triton (@triton.jit) or CUDA C++ built with
# torch.utils.cpp_extension.load_inline (KernelBench's CUDA format).
BACKENDS: tuple[str, ...] = ("triton", "cuda")

# Read-only (MappingProxyType, all the way down): the comparison reads it after candidate code
# has run, and a module's objects are reachable from candidate code (`sys.modules`).
TOLERANCE_PROFILES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        # KernelBench v0.1: atol = rtol = 1e-2 for every dtype.
        "default": MappingProxyType({"float32": 1e-2, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-2}),
        # KernelBench HEAD style: fp32 must match to 1e-4; half types keep 1e-2.
        "strict": MappingProxyType({"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-4}),
    }
)

MAX_CORRECTNESS_TRIALS = 50
MAX_TIMING_TRIALS = 10_000
MAX_SOURCE_CHARS = 200_000


def problem_hash(reference_source: str) -> str:
    """Content hash that identifies a problem (cache keys, logs, trajectory records)."""
    return hashlib.sha256(reference_source.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate. Every field has a default, so `{}` is a valid options object."""

    correctness_trials: int = 5  # fresh seed and fresh inputs per trial
    timing: bool = True  # ignored (timing is null) on CPU workers
    timing_trials: int = 100  # timed calls per model after warm-up (first is discarded)
    warmup_trials: int = 3
    seed: int = 42  # base seed; trial i uses seed + i
    tolerance: str = "default"  # key of TOLERANCE_PROFILES
    timeout_s: float | None = None  # wall-clock cap; None = server default; clipped to server max
    backend: str = "triton"  # one of BACKENDS
    # GPU: also time the reference compiled by torch.compile (default mode, compiled outside the
    # timing, cached per problem and GPU like the eager one) and report speedup_vs_compile
    baseline_compile: bool = False


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: a KernelBench-format reference and a candidate defining ModelNew."""

    reference: str
    candidate: str
    options: EvalOptions = field(default_factory=EvalOptions)
    problem_id: str | None = None  # free-form label for logs and stats
    request_id: str | None = None  # echoed back in the result

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Check:
    """An anti-cheat or sanity check that fired. `severity` reject => status rejected."""

    id: str
    message: str
    severity: str = "reject"  # "reject" | "warn"


@dataclass(frozen=True)
class TrialResult:
    seed: int
    passed: bool
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    mismatch: str | None = None  # structural problem (shape/dtype/type), if any
    detail: str | None = None  # numeric failure: share of bad elements, worst index, got vs expected


@dataclass(frozen=True)
class TimingStats:
    """Milliseconds per call over the timed trials."""

    median_ms: float
    min_ms: float
    mean_ms: float
    iqr_ms: float
    cv: float  # coefficient of variation (std / mean)
    trials: int
    # host wall clock per launch-inclusive trial (from the call to after the device sync)
    wall_median_ms: float | None = None
    # timing.py: median of the trials timed without the GPU lead (host launch time included)
    launch_median_ms: float | None = None
    # the judge's timing: the protocol's hand-over (an empty window's median), taken out of every
    # window of both models (the former in-process timing: the GPU delay queued before each trial)
    lead_ms: float | None = None
    # launch-inclusive median beyond the lead-timed one plus the host's call time: work that
    # ran outside the timed stream during the lead (0.0 when none)
    escaped_ms: float | None = None
    # the two escape checks apart, each one's excess over its allowance (margin included): stream
    # end to end beyond the synchronize latency (`escape_tail_ms`), and the launch-inclusive
    # check trials beyond GPU time + host call + one launch (`escape_launch_ms`, None without the
    # lead), each against its waited baseline when the bare one was exceeded (timing.py);
    # negative when the check passed, escaped_ms = max(0, both)
    escape_tail_ms: float | None = None
    escape_launch_ms: float | None = None
    # "gpu-time" (one call per window) or "gpu-time-batched" (`calls_per_trial` calls per
    # window, times per call); fixed per problem, the same for both models (judge/timing.py)
    method: str | None = None
    calls_per_trial: int = 1
    # window time and calls of the warm-up before the timed windows (judge/timing.py)
    warmup_ms: float | None = None
    warmup_calls: int | None = None
    # judge/timing.py: timed calls whose output was snapshotted and compared with the reference
    # (None: the timing verified none, e.g. the reference's own)
    verified_calls: int | None = None


@dataclass
class KernelTime:
    """Where the GPU time of one profiled forward went (CUPTI, the first correctness call): the
    candidate's own kernels against all device activity (copies and fills included), and the
    largest other activities. What the profiling-based reward scales by."""

    own_share: float  # own kernels' time / all device time, 0..1
    own_us: float
    total_us: float
    others: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "us"}], largest first
    # the reference's forward on the same device (profiled once per problem and device, cached
    # with its facts): all its device time, and its largest activities (the first: its bottleneck)
    reference_us: float | None = None
    reference_top: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "us"}], largest first


@dataclass
class Roofline:
    """How close the candidate's measured time came to the device's peaks (an estimate: the bytes
    are one call's inputs and outputs, the FLOPs what torch's counter sees in the reference's
    forward, the peaks the vendor's; physics_floor.py's table)."""

    device: str  # the table entry, e.g. "H100 SXM"
    gbs: float  # achieved memory throughput, GB/s (inputs + outputs / candidate time)
    bandwidth_share: float  # of the peak memory bandwidth, 0..1
    tflops: float | None = None  # achieved TFLOP/s (None: no counted FLOPs)
    compute_share: float | None = None  # of the dense fp16/bf16 tensor-core peak


@dataclass
class EvalResult:
    status: str
    compiled: bool = False
    correct: bool = False
    trials: list[TrialResult] = field(default_factory=list)
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    checks: list[Check] = field(default_factory=list)
    # the candidate's kernel launches seen during its first forward (Triton: every launch;
    # CUDA: its own __global__ kernels seen by the GPU profiler)
    kernel_launches: int = 0
    kernel_time: KernelTime | None = None  # null where not profiled (CPU, a failed forward)
    roofline: Roofline | None = None  # null without timing or on a device not in the peak table
    reference_timing: TimingStats | None = None
    candidate_timing: TimingStats | None = None
    speedup: float | None = None  # reference median / candidate median; null without timing
    # how the reference was timed: "measured ...", "spot check ..." (the cache), "remeasured: ..."
    # (drift), or "timed by this worker ..." (judge/known.py)
    reference_timing_source: str | None = None
    # options.baseline_compile: the reference compiled by torch.compile, timed by the same method
    compile_reference_timing: TimingStats | None = None
    speedup_vs_compile: float | None = None  # compiled reference median / candidate median
    # "measured", "cache" (the worker's, judge/known.py), or "failed: <why>; the eager reference stands in" (then
    # speedup_vs_compile = speedup); null when not asked or not timed
    compile_baseline: str | None = None
    error: dict[str, str] | None = None  # {"type", "message", "traceback"} of the failure
    stdout_tail: str = ""  # what the candidate printed (trimmed)
    feedback: str = ""  # text meant for the model: what happened and what to fix
    device: str = ""  # where it ran, e.g. "cuda:3 (NVIDIA H200)" or "cpu (triton interpreter)"
    worker: int | None = None
    elapsed_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    problem_hash: str = ""
    problem_id: str | None = None
    request_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        """Rebuild a result from its JSON; unknown fields anywhere raise ValidationError."""
        data = dict(data)
        _reject_unknown("result", data, {f.name for f in dataclasses.fields(cls)})
        data["trials"] = [
            build_dataclass(TrialResult, f"result.trials[{i}]", t) for i, t in enumerate(data.get("trials", []))
        ]
        data["checks"] = [
            build_dataclass(Check, f"result.checks[{i}]", c) for i, c in enumerate(data.get("checks", []))
        ]
        for key in ("reference_timing", "candidate_timing", "compile_reference_timing"):
            if data.get(key) is not None:
                data[key] = build_dataclass(TimingStats, f"result.{key}", data[key])
        if data.get("kernel_time") is not None:
            data["kernel_time"] = _kernel_time(build_dataclass(KernelTime, "result.kernel_time", data["kernel_time"]))
        if data.get("roofline") is not None:
            data["roofline"] = build_dataclass(Roofline, "result.roofline", data["roofline"])
        return cls(**data)


def _kernel_time(kt: KernelTime) -> KernelTime:
    """A profile as the evaluator makes it: the profiling-based reward multiplies the speedup bonus
    by `own_share`, and the candidate's process reports it, so a share outside 0..1 (or times
    that are not finite, non-negative numbers) is a forged report, never a reward factor."""
    share = kt.own_share
    if not isinstance(share, (int, float)) or not math.isfinite(share) or not 0 <= share <= 1:
        raise ValidationError(f"result.kernel_time.own_share: must be a number in [0, 1], got {share!r}")
    for name in ("own_us", "total_us"):
        value = getattr(kt, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValidationError(f"result.kernel_time.{name}: must be a finite number >= 0, got {value!r}")
    return kt


def result_for(request: EvalRequest, status: str, device: str = "") -> EvalResult:
    """A result that names the request's problem and ids (the one place that copies them)."""
    return EvalResult(
        status=status,
        device=device,
        problem_hash=problem_hash(request.reference),
        problem_id=request.problem_id,
        request_id=request.request_id,
    )


def build_dataclass(cls: type, path: str, data: Any) -> Any:
    """`cls` from a JSON object of its fields only (ValidationError naming `path` otherwise)."""
    _check_type(path, data, dict)
    _reject_unknown(path, data, {f.name for f in dataclasses.fields(cls)})
    try:
        return cls(**data)
    except TypeError as exc:  # a missing required field
        raise ValidationError(f"{path}: {exc}") from None


# --------------------------------------------------------------------------- validation


def parse_options(data: Any) -> EvalOptions:
    if data is None:
        return EvalOptions()
    _check_type("options", data, dict)
    allowed = {f.name for f in dataclasses.fields(EvalOptions)}
    _reject_unknown("options", data, allowed)
    kwargs: dict[str, Any] = {}
    for name in ("correctness_trials", "timing_trials", "warmup_trials", "seed"):
        if name in data:
            _check_type(f"options.{name}", data[name], int)
            kwargs[name] = data[name]
    for name in ("timing", "baseline_compile"):
        if name in data:
            _check_type(f"options.{name}", data[name], bool)
            kwargs[name] = data[name]
    for name, what, known in (
        ("tolerance", "profile", sorted(TOLERANCE_PROFILES)),
        ("backend", "backend", list(BACKENDS)),
    ):
        if name in data:
            _check_type(f"options.{name}", data[name], str)
            if data[name] not in known:
                raise ValidationError(f"options.{name}: unknown {what} {data[name]!r}; known: {known}")
            kwargs[name] = data[name]
    if data.get("timeout_s") is not None:
        _check_type("options.timeout_s", data["timeout_s"], (int, float))
        if not math.isfinite(data["timeout_s"]) or data["timeout_s"] <= 0:
            raise ValidationError(
                f"options.timeout_s: must be a finite number > 0, got {data['timeout_s']!r}"
            )
        kwargs["timeout_s"] = float(data["timeout_s"])
    opts = EvalOptions(**kwargs)
    if not 1 <= opts.correctness_trials <= MAX_CORRECTNESS_TRIALS:
        raise ValidationError(f"options.correctness_trials: must be in [1, {MAX_CORRECTNESS_TRIALS}]")
    if not 2 <= opts.timing_trials <= MAX_TIMING_TRIALS:
        raise ValidationError(f"options.timing_trials: must be in [2, {MAX_TIMING_TRIALS}]")
    if not 0 <= opts.warmup_trials <= 1000:
        raise ValidationError("options.warmup_trials: must be in [0, 1000]")
    if not 0 <= opts.seed < 2**31:
        raise ValidationError("options.seed: must be in [0, 2**31)")
    return opts


def parse_request(data: Any) -> EvalRequest:
    """Validate a decoded JSON body and build an EvalRequest (raises ValidationError)."""
    _check_type("body", data, dict)
    allowed = {f.name for f in dataclasses.fields(EvalRequest)}
    _reject_unknown("", data, allowed)
    for name in ("reference", "candidate"):
        if name not in data:
            raise ValidationError(f"missing required field {name!r}")
        _check_type(name, data[name], str)
        if not data[name].strip():
            raise ValidationError(f"{name}: must not be empty")
        if len(data[name]) > MAX_SOURCE_CHARS:
            raise ValidationError(f"{name}: longer than {MAX_SOURCE_CHARS} characters")
    for name in ("problem_id", "request_id"):
        if data.get(name) is not None:
            _check_type(name, data[name], str)
            if len(data[name]) > 256:
                raise ValidationError(f"{name}: longer than 256 characters")
    return EvalRequest(
        reference=data["reference"],
        candidate=data["candidate"],
        options=parse_options(data.get("options")),
        problem_id=data.get("problem_id"),
        request_id=data.get("request_id"),
    )
