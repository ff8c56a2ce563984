"""The reference's facts (float64 precision baseline, output/input bytes, FLOPs) are computed once
per problem, seed, device, torch and precision policy and then read from the reference cache:
the float64 pass (sub-phase reference_precision) and the counting forward are skipped on a hit,
and what the candidate phases get is the same."""

from __future__ import annotations

from pathlib import Path

import torch

from eval_server import samples
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline import evaluate
from eval_server.pipeline.context import EvalContext, Reference
from eval_server.pipeline.ref_cache import RefTimingCache
from eval_server.pipeline.reference import reference_phase
from eval_server.pipeline.verdicts import Stop
from eval_server.schema import EvalOptions, EvalRequest, EvalResult, problem_hash
from tests.unit.test_precision_check import PROBLEM  # Linear(256 -> 128) on 64 x 256


def _ctx(tmp_path: Path, cache: RefTimingCache | None, policy: str = "fp32") -> EvalContext:
    return EvalContext(
        device=torch.device("cpu"),
        device_label="cpu",
        workdir=tmp_path,
        timing_enabled=False,
        ref_cache=cache,
        hardening=Hardening(precision_policy=policy),
    )


def _reference(ctx: EvalContext, seed: int = 42) -> tuple[Reference, EvalResult]:
    request = EvalRequest(reference=PROBLEM, candidate="", options=EvalOptions(seed=seed))
    result = EvalResult(status="ok", problem_hash=problem_hash(PROBLEM))
    return reference_phase(request, ctx, result), result


def _facts(ref: Reference) -> tuple:
    return (ref.precision, ref.output_bytes, ref.input_bytes, ref.flops)


def test_second_reference_phase_reads_the_facts(tmp_path: Path) -> None:
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    first_ctx = _ctx(tmp_path, cache)
    first, _ = _reference(first_ctx)
    assert "reference_precision" in first_ctx.phases  # a miss: the float64 pass ran
    assert first.precision is not None and first.precision.ref_error > 0
    assert (first.output_bytes, first.input_bytes, first.flops) == (
        64 * 128 * 4,
        64 * 256 * 4,
        2 * 64 * 256 * 128,
    )

    again_ctx = _ctx(tmp_path, RefTimingCache(tmp_path / "ref.sqlite"))  # another evaluation process
    again, _ = _reference(again_ctx)
    assert "reference_precision" not in again_ctx.phases  # a hit: no float64 pass
    assert _facts(again) == _facts(first)


def test_without_a_cache_every_evaluation_computes_them(tmp_path: Path) -> None:
    for _ in range(2):
        ctx = _ctx(tmp_path, None)
        _reference(ctx)
        assert "reference_precision" in ctx.phases


def test_another_seed_or_policy_is_a_miss(tmp_path: Path) -> None:
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    _reference(_ctx(tmp_path, cache))
    for ctx, seed in ((_ctx(tmp_path, cache), 7), (_ctx(tmp_path, cache, policy="tf32"), 42)):
        _reference(ctx, seed)
        assert "reference_precision" in ctx.phases


def test_an_unreadable_entry_is_a_miss(tmp_path: Path) -> None:
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    ctx = _ctx(tmp_path, cache)
    _reference(ctx)
    key = cache._conn.execute("SELECT key FROM ref_facts").fetchone()[0]
    cache._conn.execute("UPDATE ref_facts SET facts = ? WHERE key = ?", ('{"precision": 3}', key))
    again = _ctx(tmp_path, cache)
    ref, _ = _reference(again)
    assert "reference_precision" in again.phases and ref.precision is not None


def test_cache_connection_is_closed_before_candidate_code(tmp_path: Path, monkeypatch) -> None:
    """Candidate code never shares the process with an open connection to the cache file."""
    seen: list[object] = []

    def load_candidate(request, ctx, result, ref):  # stands in for load_candidate: records, then stops
        seen.append(ctx.ref_cache)
        raise Stop

    monkeypatch.setattr(evaluate, "load_candidate", load_candidate)
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    ctx = _ctx(tmp_path, cache)
    request = EvalRequest(
        reference=samples.load_problem("relu"), candidate=samples.load_candidate("relu__correct")
    )
    evaluate.evaluate(request, ctx)
    assert seen == [None]
    assert "reference_precision" in ctx.phases  # the reference phase ran (and used the cache)
