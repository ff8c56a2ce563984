"""The judge's evaluation: the verdict, decided in a process that never runs candidate code.

Order:
0. The candidate's static rules, here (static_verdict, called by the worker before the memory
   share and the GPU lock): a refused or unparsable candidate ends before anything below.
1. The reference, here: imported from the request, built after the seed; one forward on fresh
   inputs gives the output's structure and the problem's bytes and FLOPs (physics floor).
2. GPU with timing: the runner serves the reference (before any candidate code exists in it) and
   the judge times it through the protocol (gpu_calls.py), by the problem's one method; the
   protocol's own hand-over (empty windows) is measured first and taken out of both timings.
3. The runner runs the first layer on the candidate (static rules, audit hook, build, load, its
   own correctness trials under CUPTI and the recorders) and reports. A report that is not `ok`
   ends the evaluation with that status (forging a failure only hurts the candidate); an `ok`
   report is a claim the judge checks:
4. Correctness by the judge: JUDGE_CALLS calls on inputs of secret seeds, every output compared
   here with the reference's (GPU: snapshots of the runner's outputs taken after its "done"; CPU:
   outputs sent back as bytes).
5. Timing (GPU): the candidate by the reference's method; kept snapshots compared; the judge's
   own steps around the windows compared with the reference's (escaped work); physics floor.
The result is built and serialised here; the runner's report contributes only descriptive
fields (its checks, trials, kernel counts) and what can make the verdict worse.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from eval_server import wire
from eval_server.checks import compare, physics_floor
from eval_server.checks.compare import (
    Comparison,
    tolerance_for,
    unflatten_like,
)
from eval_server.feedback import build_feedback
from eval_server.judge import known, precision
from eval_server.judge import timing as jtiming
from eval_server.judge.channel import Channel, RunnerError
from eval_server.judge.gpu_calls import GpuSession, Leaf, OutputMismatch, expected_leaves, fresh_seed
from eval_server.pipeline import loader, shapes
from eval_server.pipeline.candidate import static_phase
from eval_server.pipeline.context import EvalContext
from eval_server.pipeline.ref_cache import cache_key
from eval_server.pipeline.reference import forward_counting_flops, judge_facts, nbytes
from eval_server.pipeline.timing import gpu_cycles_per_ms, l2_flush_buffer
from eval_server.pipeline.verdicts import Stop
from eval_server.schema import (
    EVALUATOR_STATUSES,
    STATUS_CRASHED,
    STATUS_INCORRECT,
    STATUS_OK,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_SERVER_ERROR,
    STATUS_UNSUPPORTED,
    STATUSES,
    Check,
    EvalRequest,
    EvalResult,
    Roofline,
    TimingStats,
    result_for,
)

JUDGE_CALLS = 2  # calls on secret inputs compared by the judge before timing
HANDOVER_WINDOWS = 20  # empty windows that measure the protocol's own cost
# Escaped work: the judge's fill and snapshot around a candidate window may take longer than
# around the reference's by this much plus this share of the candidate's window.
ESCAPE_MARGIN_MS = 0.05
ESCAPE_MARGIN_SHARE = 0.5
# statuses a runner may report; others (server_error, reference_error: claims about the
# evaluator or the problem, which the judge has just run fine) read as the candidate's crash
RUNNER_STATUSES = frozenset(STATUSES) - set(EVALUATOR_STATUSES)


class _Done(Exception):
    """The verdict is reached."""


@dataclass
class _Ref:
    module: Any
    model: torch.nn.Module
    leaves: list[Leaf]
    input_bytes: int
    output_bytes: int
    flops: int
    # judge/precision.py's facts: measured here, or the worker's (given); {} none
    precision: dict[str, Any] | None = None


def evaluate(
    request: EvalRequest, ctx: EvalContext, channel: Channel, handoff: known.Handoff | None = None
) -> EvalResult:
    """The whole judgement (RunnerFailed propagates: the caller reads the runner's exit).
    `handoff`: the reference timings the worker knows for this problem, and where the judge
    leaves the one it measured (known.py)."""
    compare.disable_fused()  # torch ops only: nothing loaded from the Triton cache candidates share
    result = result_for(request, STATUS_OK, ctx.device_label)
    t0 = time.perf_counter()
    # One stream for all the judge's GPU work: torch's allocator keeps freed blocks per stream, and
    # the reference's forward, the windows and the checks on three streams held three pools (a
    # judged KernelBench softmax, 6.4 GB tensors: 48-54 GB reserved, processes to ~100 GB, 1x H200)
    stream = torch.cuda.Stream(ctx.device) if ctx.device.type == "cuda" else None
    try:
        with torch.cuda.stream(stream):
            _judge(request, ctx, channel, result, handoff)
    except _Done:
        pass
    return _finish(result, request, ctx.phases, t0)


def static_verdict(request: EvalRequest, ctx: EvalContext) -> EvalResult | None:
    """The candidate's static rules, applied here before the reference, the GPU lock or the
    runner: a candidate they refuse (or that does not parse) ends now, its result the first
    layer's would be. Parsing and reading a syntax tree run nothing of the candidate. Such a fresh
    candidate cost its worker 0.25-0.78 s of reference, slot binding and an exclusive hand-over
    (1x H200, the bundled mix: 13 of 48 refused statically or unparsable). None: the rules accept
    it (the runner's first layer applies them again, as its own phase)."""
    result = result_for(request, STATUS_OK, ctx.device_label)
    t0 = time.perf_counter()
    try:
        static_phase(request, ctx, result)
    except Stop:
        return _finish(result, request, {"static": round(time.perf_counter() - t0, 6)}, t0)
    except Exception:  # noqa: BLE001, S110 - RecursionError, MemoryError of the parser (deep
        pass  # nesting): the candidate's process meets them again, and its failure is the candidate's
    return None


def _finish(result: EvalResult, request: EvalRequest, phases: dict[str, float], t0: float) -> EvalResult:
    """The judge's phases (prefixed `judge_`), its elapsed time since `t0`, the feedback."""
    result.phases = {**result.phases, **{f"judge_{k}": v for k, v in phases.items()}}
    result.elapsed_s = round(time.perf_counter() - t0, 6)
    if not result.feedback:
        result.feedback = build_feedback(result, tolerance_for(request.options.tolerance, torch.float32))
    return result


def _end(result: EvalResult, status: str, check_id: str | None, message: str) -> None:
    result.status = status
    result.correct = False
    result.speedup = None
    if check_id is not None:
        result.checks.append(Check(check_id, message))
    else:
        result.error = {"type": status, "message": message, "traceback": ""}
    raise _Done


def _reference(
    request: EvalRequest, ctx: EvalContext, result: EvalResult, seed: int, precision_policy: str | None = None
) -> _Ref:
    """The judge's reference and its output's structure; with `precision_policy`, also its
    precision facts (a float64 pass on the same inputs and output)."""
    opts = request.options
    try:
        module = loader.import_source(request.reference, ctx.workdir, "judge_reference")
        init = loader.make_init_inputs(module, opts.seed, ctx.device)
        model = loader.build_model(module.Model, init, opts.seed, ctx.device)
        args = loader.make_inputs(module, seed, ctx.device)
        with torch.no_grad():
            out, flops = forward_counting_flops(model, args)
        leaves = expected_leaves(out)
    except Exception as exc:  # noqa: BLE001 - the problem's own failure
        _end(result, STATUS_REFERENCE_ERROR, None, f"The reference failed: {type(exc).__name__}: {exc}")
    ref = _Ref(module, model, leaves, nbytes(args), nbytes(out), flops)
    if precision_policy is not None:
        with ctx.phase("precision"), ctx.gpu():
            ref.precision = precision.measure(module, model, seed, out, ctx.device, precision_policy)
        del args, out
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # float64 copies: give the memory back, as the runner does
    return ref


def _merge_report(result: EvalResult, report: Any) -> EvalResult | None:
    """The runner's report, validated; its descriptive fields into `result`. None: unreadable."""
    try:
        rep = EvalResult.from_json(report)
    except Exception:  # noqa: BLE001 - anything malformed is the candidate's process's doing
        return None
    for name in (
        "compiled",
        "trials",
        "max_abs_diff",
        "max_rel_diff",
        "kernel_launches",
        "kernel_time",
        "error",
    ):
        setattr(result, name, getattr(rep, name))
    result.checks = list(rep.checks)
    # the runner's own phases; the judge's (judge_*) are the judge's word alone
    result.phases = {k: v for k, v in rep.phases.items() if wire.finite(v) and not k.startswith("judge_")}
    return rep


def _judge(
    request: EvalRequest,
    ctx: EvalContext,
    channel: Channel,
    result: EvalResult,
    handoff: known.Handoff | None,
) -> None:
    opts = request.options
    cuda = ctx.device.type == "cuda"
    timing = cuda and ctx.timing_enabled and opts.timing
    # the runner's memory share is the judge's word (the worker's, or a whole GPU's when alone)
    channel.send({"request": request.to_json(), "memory_share": ctx.hardening.gpu_memory_fraction})
    # the worker's entry of the problem (judge/known.py), looked up once: its timing, its precision
    # facts (stale timings too: the facts do not depend on the GPU's clock), its compiled baseline
    given = None
    if cuda and handoff is not None and handoff.given:
        given = known.find(handoff.given, cache_key(reference_cache_key(result.problem_hash, ctx, opts)))
    known_facts = given.precision if given is not None else None
    # measured (when not known) with the reference, before the runner holds anything of it: the
    # float64 pass is the judge's largest footprint
    with ctx.phase("reference"), torch.no_grad():
        policy = ctx.hardening.precision_policy if known_facts is None else None
        ref = _reference(request, ctx, result, opts.seed, policy)
        shape = _shape_variant(request, ctx)
    facts = known_facts if known_facts is not None else ref.precision
    ref.precision = facts
    session = None
    ref_timing: jtiming.Timing | None = None
    handover_ms = 0.0
    if cuda:
        session = GpuSession(
            channel,
            ctx.device,
            ref.module,
            ref.model,
            ref.leaves,
            opts.tolerance,
            l2_flush_buffer(ctx.device) if timing else None,
            torch.cuda.current_stream(ctx.device),
        )
    if timing:
        assert session is not None
        ref_timing, handover_ms = _reference_timing(request, ctx, result, channel, session, handoff, given)
        if opts.baseline_compile:
            _time_compiled_reference(
                request, ctx, result, channel, session, ref_timing, handover_ms, handoff, given
            )
    if handoff is not None and handoff.learned is not None:
        handoff.learned = replace(handoff.learned, precision=facts)
    held_to = precision.rule_for(facts, ctx.hardening)
    if session is not None:
        session.precision = held_to

    try:
        _candidate(request, ctx, channel, result, ref, session, ref_timing, handover_ms, shape, held_to)
        if result.speedup is not None and result.candidate_timing is not None:
            if result.compile_reference_timing is not None:
                cand_ms = result.candidate_timing.median_ms
                compiled_ms = result.compile_reference_timing.median_ms
                result.speedup_vs_compile = jtiming.speedup(compiled_ms, cand_ms)
            elif result.compile_baseline is not None:  # failed: the eager reference stands in
                result.speedup_vs_compile = result.speedup
    except OutputMismatch as exc:
        _end(result, STATUS_INCORRECT, "judge.output", f"The output does not match the reference: {exc}.")
    except RunnerError as exc:
        _end(result, STATUS_RUNTIME_ERROR, None, f"Your forward failed on inputs the judge chose:\n{exc}")
    except wire.WireError as exc:
        _end(
            result,
            STATUS_CRASHED,
            None,
            f"The candidate's process answered the evaluator with something unusable: {exc}.",
        )


def _candidate(
    request: EvalRequest,
    ctx: EvalContext,
    channel: Channel,
    result: EvalResult,
    ref: _Ref,
    session: GpuSession | None,
    ref_timing: jtiming.Timing | None,
    handover_ms: float,
    shape: tuple[Any, dict[str, tuple[int, int]]] | None,
    held_to: precision.Rule | None = None,
) -> None:
    """Everything after the candidate's import: what goes wrong here is the candidate's doing."""
    opts = request.options
    cuda = ctx.device.type == "cuda"
    if cuda:
        # The runner's first layer (the reference in float64, the candidate's correctness runs) is
        # its largest footprint, and the judge sits idle meanwhile on what its reference timing
        # left cached: at KernelBench's softmax 42-48 GB reserved for 6 GB of live tensors (1x
        # H200), too much for an 80 GB GPU beside a runner that needed 25 GB there at the softmax
        # (more at KernelBench's 7-8 GiB norms). Given back here; taken again as the calls need it.
        torch.cuda.empty_cache()
    with ctx.phase("first_layer"):
        try:
            # the reference's facts the candidate's checks use, the judge's own (never a file)
            given = judge_facts(ref.precision, ref.output_bytes, ref.input_bytes, ref.flops)
            msg, _ = channel.ask({"op": "candidate", "facts": given})
        except RunnerError as exc:
            _end(result, STATUS_CRASHED, None, f"The candidate's process failed while it was checked:\n{exc}")
    rep = _merge_report(result, msg.get("report"))
    if rep is None:
        _end(result, STATUS_CRASHED, None, "The candidate's process reported an unreadable result.")
    if rep.status != STATUS_OK:
        status = rep.status
        if status == STATUS_UNSUPPORTED and not cuda and opts.backend == "cuda":
            pass  # this worker cannot run CUDA candidates: the runner is right
        elif status not in RUNNER_STATUSES:
            result.error = {
                "type": STATUS_CRASHED,
                "message": f"The candidate's process ended its evaluation as {status!r}: "
                + ((rep.error or {}).get("message") or ""),
                "traceback": "",
            }
            status = STATUS_CRASHED
        if status == rep.status:  # the first layer's own text (it can only hurt itself), whose
            result.feedback = rep.feedback  # numbers the wire turned to null ("max abs diff inf")
        result.status = status
        result.correct = False
        raise _Done

    with ctx.phase("correctness_calls"), ctx.gpu():
        checked = _judge_calls(session, ctx, channel, ref, request, held_to)
    bad = next((c for c in checked if not c.passed), None)
    if bad is not None:
        _end(result, STATUS_INCORRECT, "judge.output", _wrong_text(bad, "a call on inputs the judge chose"))
    with ctx.phase("second_shape"), ctx.gpu():
        _second_shape(request, ctx, channel, result, ref, session, shape)
    result.compiled = True
    result.correct = True
    if ref_timing is None:
        return
    assert session is not None
    with ctx.phase("timing"), ctx.gpu(exclusive=True):
        cand = _time_candidate(opts, ctx, result, session, ref_timing, handover_ms)
    result.speedup = jtiming.speedup(ref_timing.stats.median_ms, cand.stats.median_ms)
    if cand.stats.median_ms < jtiming.MIN_CALL_MS:
        result.checks.append(
            Check(
                "judge.unresolved_time",
                f"your time per call ({cand.stats.median_ms * 1e3:.3g} us) is below what the judge resolves: "
                f"the speedup counts {jtiming.MIN_CALL_MS * 1e3:g} us",
                "warn",
            )
        )
    _physics_floor(result, ctx, ref, ref_timing.stats, cand.stats)


def _check_resolved(result: EvalResult, ref_timing: jtiming.Timing, handover_ms: float) -> None:
    """A reference whose windows were no longer than the empty hand-over has no time to divide by:
    the evaluator's failure (two CUDA contexts time-slicing without MPS hand over in ~0.1-1 ms,
    jittering past whole windows), never a speedup from 0 ms."""
    if ref_timing.stats.median_ms >= jtiming.MIN_CALL_MS:
        return
    window = sorted(ref_timing.windows.window_ms)[len(ref_timing.windows.window_ms) // 2]
    _end(
        result,
        STATUS_SERVER_ERROR,
        None,
        f"The evaluator could not time the reference: its median window ({window:.4g} ms for "
        f"{ref_timing.stats.calls_per_trial} calls) was hardly longer than the judge's empty hand-over "
        f"({handover_ms:.4g} ms). GPU workers time through CUDA MPS (the server's --mps on); a reference "
        "that does no GPU work cannot be timed.",
    )


def _reference_timing(
    request: EvalRequest,
    ctx: EvalContext,
    result: EvalResult,
    channel: Channel,
    session: GpuSession,
    handoff: known.Handoff | None,
    entry: known.KnownReference | None,
) -> tuple[jtiming.Timing, float]:
    """The reference's timing and this pair's hand-over, both before any candidate code exists in
    the runner: the worker's known timing of the problem (`entry`) when it is fresh (only the
    hand-over is measured here), else the reference served by the runner and timed (cache and
    spot check, or in full), which the worker then keeps."""
    key_parts = reference_cache_key(result.problem_hash, ctx, request.options)
    handover_ms = None
    why = ""
    if entry is not None:
        with ctx.phase("bind"), ctx.gpu():
            session.bind(entry.stats.calls_per_trial)
        with ctx.phase("handover"), ctx.gpu(exclusive=True):
            handover_ms = _handover(session)  # its first window measures the GPU's clock
        now = time.monotonic()
        stale = entry.stale(now, ctx.hardening.reference_max_age_s, gpu_cycles_per_ms(ctx.device))
        if stale is None:
            result.reference_timing = entry.stats
            result.reference_timing_source = (
                f"timed by this worker {now - entry.measured_at:.0f} s earlier, before any candidate "
                "code, at this GPU clock"
            )
            return jtiming.Timing(entry.stats, entry.pre_ms, entry.post_ms), handover_ms
        why = f"; the worker's timing was stale ({stale})"
    with ctx.phase("reference_load"), ctx.gpu():
        channel.ask({"op": "reference"})
        session.bind(1)
    with ctx.phase("reference_timing"), ctx.gpu(exclusive=True):
        if handover_ms is None:
            with ctx.phase("handover"):
                handover_ms = _handover(session)
        ref_timing = _time_reference(request, ctx, result, session, handover_ms, key_parts)
    result.reference_timing_source = (result.reference_timing_source or "") + why
    _check_resolved(result, ref_timing, handover_ms)
    if handoff is not None:
        handoff.learned = known.KnownReference(
            cache_key(key_parts),
            ref_timing.stats,
            ref_timing.pre_ms,
            ref_timing.post_ms,
            gpu_cycles_per_ms(ctx.device),
            time.monotonic(),
        )
    return ref_timing, handover_ms


def _handover(session: GpuSession) -> float:
    """Median ms of an empty window (go, the runner's done, nothing between): the protocol's cost."""
    session.run(5, 0)  # the first windows of a pair are slower: not the hand-over's steady cost
    times, _ = session.run(HANDOVER_WINDOWS, 0)
    return sorted(times.window_ms)[len(times.window_ms) // 2] if times.window_ms else 0.0


def _settings(ctx: EvalContext, opts: Any, spot: bool = False) -> dict[str, Any]:
    hard = ctx.hardening
    return {
        "max_windows": (hard.spot_check_trials if spot else opts.timing_trials),
        "min_windows": min(hard.timing_min_trials, opts.timing_trials)
        if not spot
        else hard.spot_check_trials,
        "ci_rel": hard.timing_ci_rel if not spot else 0.0,
        "keep_cap": 2,
    }


def reference_cache_key(problem: str, ctx: EvalContext, opts: Any) -> dict[str, Any]:
    """The reference cache's key for the judge's timing of a problem on this GPU."""
    return {
        "problem": problem,
        "gpu": torch.cuda.get_device_name(ctx.device),
        "torch": torch.__version__,
        "triton": ctx.versions.get("triton", ""),
        "method": jtiming.METHOD,
        "timing_trials": opts.timing_trials,
        "ci": ctx.hardening.timing_ci_rel,
    }


def _time_reference(
    request: EvalRequest,
    ctx: EvalContext,
    result: EvalResult,
    session: GpuSession,
    handover_ms: float,
    key: dict[str, Any],
) -> jtiming.Timing:
    """`key`: the reference cache's key parts (reference_cache_key)."""
    opts = request.options
    cached = ctx.ref_cache.get(key) if ctx.ref_cache is not None else None
    if cached is not None and cached.method is not None:
        k = cached.calls_per_trial
        session.bind(k)
        spot = jtiming.time_model(session, k, **_settings(ctx, opts, spot=True), handover_ms=handover_ms)
        drift = (
            abs(spot.stats.median_ms - cached.median_ms) / cached.median_ms
            if cached.median_ms > 0
            else math.inf
        )
        if drift <= ctx.hardening.drift_tolerance:
            result.reference_timing = spot.stats
            result.reference_timing_source = (
                f"spot check of {spot.stats.trials} windows in this evaluation; cached full timing "
                f"{cached.median_ms:.4g} ms (drift {drift:.1%})"
            )
            return spot
        source = f"remeasured: spot check {spot.stats.median_ms:.4g} ms vs cached {cached.median_ms:.4g} ms"
        full = jtiming.time_model(session, k, **_settings(ctx, opts), handover_ms=handover_ms)
    else:
        single = jtiming.time_model(session, 1, **_settings(ctx, opts), handover_ms=handover_ms)
        k = jtiming.choose_k(single.stats.median_ms)
        source = "measured"
        full = single
        if k > 1:
            session.bind(k)
            full = jtiming.time_model(session, k, **_settings(ctx, opts), handover_ms=handover_ms)
            source += f"; {k} calls per window, chosen from its {single.stats.median_ms:.4g} ms timed one call per window"
    if ctx.ref_cache is not None:
        ctx.ref_cache.put(key, full.stats)
    result.reference_timing = full.stats
    result.reference_timing_source = source
    return full


def _time_compiled_reference(
    request: EvalRequest,
    ctx: EvalContext,
    result: EvalResult,
    channel: Channel,
    session: GpuSession,
    eager: jtiming.Timing,
    handover_ms: float,
    handoff: known.Handoff | None,
    given: known.KnownReference | None,
) -> None:
    """The second baseline: the reference through torch.compile, served by the runner before any
    candidate code exists in it, timed by the eager reference's method (same calls per window)
    and kept by the worker with the eager reference's timing (judge/known.py: stale with it),
    never in the reference cache's file, which a candidate's process can write (its timing is
    what `speedup_vs_compile`, a reward's baseline, divides). The compile holds the GPU shared,
    only its timing exclusive. A reference that does not compile, or compiles into different
    outputs, is said so; the eager timing then stands in."""
    opts = request.options
    # the eager timing's entry: just measured, or the worker's fresh one (`given`)
    entry = handoff.learned if handoff is not None and handoff.learned is not None else given
    if entry is not None and entry.compiled is not None:
        result.compile_reference_timing, result.compile_baseline = entry.compiled, "cache"
        return
    k = eager.stats.calls_per_trial
    try:
        with ctx.phase("compile_reference"), ctx.gpu():
            channel.ask({"op": "reference", "compile": True})
            session.bind(k)
        with ctx.phase("compile_reference_timing"), ctx.gpu(exclusive=True):
            timed = jtiming.time_model(session, k, **_settings(ctx, opts), handover_ms=handover_ms)
    except (RunnerError, jtiming.StalledCalls) as exc:
        last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
        result.compile_baseline = (
            f"failed: torch.compile of the reference: {last[0][:300]}; the eager reference stands in"
        )
        return
    if timed.wrong() is not None:
        result.compile_baseline = (
            "failed: the compiled reference's outputs differ from the eager reference's beyond the "
            "tolerance; the eager reference stands in"
        )
        return
    if handoff is not None and entry is not None:
        handoff.learned = replace(entry, compiled=timed.stats)
    result.compile_reference_timing, result.compile_baseline = timed.stats, "measured"


def _time_candidate(
    opts: Any,
    ctx: EvalContext,
    result: EvalResult,
    session: GpuSession,
    ref: jtiming.Timing,
    handover_ms: float,
) -> jtiming.Timing:
    k = ref.stats.calls_per_trial
    last: jtiming.Timing | None = None
    for attempt in range(1 + ctx.hardening.escape_retimes):
        try:
            cand = jtiming.time_model(session, k, **_settings(ctx, opts), handover_ms=handover_ms)
        except jtiming.StalledCalls as exc:
            _end(result, STATUS_REJECTED, "judge.host_sync", f"Your forward could not be timed: {exc}.")
        wrong = cand.wrong()
        if wrong is not None:
            _end(
                result,
                STATUS_INCORRECT,
                "runtime.timed_output",
                _wrong_text(
                    wrong.comparison, "a timed call (every timed call's output is kept; some are compared)"
                ),
            )
        excess = cand.around_ms - ref.around_ms
        allowed = ESCAPE_MARGIN_MS + ESCAPE_MARGIN_SHARE * cand.stats.median_ms * k
        cand.stats = replace(
            cand.stats,
            escaped_ms=round(max(0.0, excess - allowed) / k, 6),
            escape_tail_ms=round((excess - allowed) / k, 6),
        )
        last = cand
        if excess <= allowed:
            if attempt:
                result.checks.append(
                    Check(
                        "runtime.escaped_timing", "escaped work in an earlier timing; re-timed clean", "warn"
                    )
                )
            result.candidate_timing = cand.stats
            return cand
    assert last is not None
    result.candidate_timing = last.stats
    _end(
        result,
        STATUS_REJECTED,
        "runtime.escaped_timing",
        f"GPU work of your forward continued after it returned: the judge's own steps around each timed call took "
        f"{(last.around_ms - ref.around_ms) * 1e3:.1f} us longer than around the reference's in every timing. "
        "Do all the work on the current stream, inside forward.",
    )
    raise AssertionError  # unreachable


def _wrong_text(c: Comparison, what: str) -> str:
    if c.mismatch:
        return f"The output of {what} does not match the reference: {c.mismatch}."
    return (
        f"The output of {what} does not match the reference (max abs diff {c.max_abs_diff}, "
        f"max rel diff {c.max_rel_diff}){': ' + c.detail if c.detail else ''}. Every call must compute "
        "the whole result from the inputs it is given."
    )


def _judge_calls(
    session: GpuSession | None,
    ctx: EvalContext,
    channel: Channel,
    ref: _Ref,
    request: EvalRequest,
    held_to: precision.Rule | None = None,
) -> list[Comparison]:
    """JUDGE_CALLS calls of the candidate on secret inputs, every output compared here."""
    if session is not None:
        if not session.slots:
            session.bind(1)
        _, checked = session.run(JUDGE_CALLS, 1, keep={(w, 0) for w in range(JUDGE_CALLS)}, flush=False)
        return [c.comparison for c in checked]
    return [_cpu_call(channel, ref, request, ctx, held_to) for _ in range(JUDGE_CALLS)]


def _shape_variant(request: EvalRequest, ctx: EvalContext) -> tuple[Any, dict[str, tuple[int, int]]] | None:
    """The problem at its second shape (shapes.py), imported before any candidate code runs."""
    return shapes.import_variant(request.reference, ctx.workdir, "judge_reference_shape")


def _second_shape(
    request: EvalRequest,
    ctx: EvalContext,
    channel: Channel,
    result: EvalResult,
    ref: _Ref,
    session: GpuSession | None,
    shape: tuple[Any, dict[str, tuple[int, int]]] | None,
) -> None:
    """One call at the problem's second input shape (shapes.py), compared like any other."""
    if shape is None:
        return
    variant, scaled = shape
    try:
        args = loader.make_inputs(variant, fresh_seed(), ctx.device)
        with torch.no_grad():
            leaves = expected_leaves(ref.model(*args))
    except Exception:  # noqa: BLE001 - the reference does not run there: no second shape
        return
    del args
    what = f"a call on inputs of a second shape ({shapes.describe(scaled)})"
    try:
        if session is None:
            comparison = _cpu_call(channel, _Ref(variant, ref.model, leaves, 0, 0, 0), request, ctx)
        else:
            other = GpuSession(
                channel,
                ctx.device,
                variant,
                ref.model,
                leaves,
                request.options.tolerance,
                None,
                session.stream,
            )
            other.bind(1)
            _, checked = other.run(1, 1, keep={(0, 0)}, flush=False)
            comparison = checked[0].comparison
            session.bind(len(session.slots))  # the problem's own shape again, for the timing
            # `other`'s buffers stay allocated: the runner still maps them (freed with this process)
    except (RunnerError, OutputMismatch) as exc:
        _end(result, STATUS_INCORRECT, "judge.shape", f"Your forward failed in {what}:\n{exc}")
    if not comparison.passed:
        _end(
            result,
            STATUS_INCORRECT,
            "judge.shape",
            _wrong_text(comparison, what) + " A kernel must not depend on the benchmark's exact sizes.",
        )


def _cpu_call(
    channel: Channel, ref: _Ref, request: EvalRequest, ctx: EvalContext, held_to: precision.Rule | None = None
) -> Comparison:
    seed = fresh_seed()
    args = loader.make_inputs(ref.module, seed, ctx.device)
    descs, chunks = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            descs.append(wire.tensor_meta(a))
            chunks.append(bytes(wire.tensor_bytes(a)))
        else:
            descs.append({"value": a})
    msg, payload = channel.ask({"op": "call", "args": descs}, b"".join(chunks))
    with torch.no_grad():
        expected = ref.model(*loader.clone_args(args))
    outs, at = [], 0
    got_descs = msg.get("outputs")
    if not isinstance(got_descs, list) or len(got_descs) != len(ref.leaves):
        n = len(got_descs) if isinstance(got_descs, list) else "?"
        return Comparison(False, mismatch=f"the output has {n} tensors, expected {len(ref.leaves)}")
    for desc, leaf in zip(got_descs, ref.leaves, strict=True):
        if not isinstance(desc, dict) or "dtype" not in desc:
            kind = desc.get("kind", "?") if isinstance(desc, dict) else "?"
            return Comparison(False, mismatch=f"{leaf.path} is a {kind}, expected a tensor")
        dtype, shape, nbytes = wire.parse_meta(desc, len(payload) - at)
        outs.append(wire.tensor_from(payload[at : at + nbytes], dtype, shape))
        at += nbytes
    return precision.compare_call(
        expected, unflatten_like(expected, outs), request.options.tolerance, held_to
    )


def _physics_floor(
    result: EvalResult, ctx: EvalContext, ref: _Ref, ref_stats: TimingStats, cand: TimingStats
) -> None:
    name = torch.cuda.get_device_name(ctx.device)
    peak = physics_floor.peak_for(name)
    if peak is None:
        result.checks.append(
            Check("runtime.physics_floor", f"no physics floor: {name} is not in the table", "warn")
        )
        return
    line = physics_floor.roofline(ref.input_bytes, ref.output_bytes, ref.flops, peak, cand.median_ms * 1e3)
    result.roofline = None if line is None else Roofline(**line)  # type: ignore[arg-type]
    l2 = int(getattr(torch.cuda.get_device_properties(ctx.device), "L2_cache_size", 0) or 0)
    floor = physics_floor.floor_for(
        ref.input_bytes, ref.output_bytes, l2, ref.flops, peak, calls_per_trial=ref_stats.calls_per_trial
    )
    if floor.floor_us < physics_floor.MIN_FLOOR_US or ref_stats.median_ms * 1e3 < floor.floor_us:
        return
    if cand.median_ms * 1e3 < floor.floor_us:
        _end(
            result,
            STATUS_REJECTED,
            "runtime.physics_floor",
            f"Your measured time {cand.median_ms * 1e3:.3g} us is below the physical minimum {floor.floor_us:.3g} us "
            f"for this problem on this GPU: {floor.describe()}. Compute the whole result on every call.",
        )
