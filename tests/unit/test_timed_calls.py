"""Fresh inputs per timed call and the secret verified calls (eval_server/pipeline/timed_calls.py),
alone and inside time_gpu on the simulated device clock of test_timing_adaptive."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import torch

from eval_server.pipeline import timing
from eval_server.pipeline.timed_calls import (
    CALL_ALIGN_BYTES,
    MAX_RECORDED,
    MIN_VERIFIED,
    VERIFIED_BYTES,
    FreshInputs,
    Verification,
)
from tests.unit.test_timing_adaptive import _Clock

pytestmark = pytest.mark.unit


def _sets(n: int = 3) -> list[list[Any]]:
    return [[torch.full((4, 5), float(s)), torch.full((3,), 10.0 + s), 7] for s in range(n)]


@pytest.mark.parametrize("calls", [1, 4])
def test_every_call_gets_new_tensors_holding_its_sets_values(calls: int) -> None:
    sets = _sets()
    fresh = FreshInputs(sets, calls, random.Random(0))
    seen_ids: set[int] = set()
    for _ in range(20):
        args, chosen = fresh.trial()
        assert len(args) == len(chosen) == calls
        for a, s in zip(args, chosen, strict=True):
            assert torch.equal(a[0], sets[s][0]) and torch.equal(a[1], sets[s][1]) and a[2] == 7
            assert a[0] is not sets[s][0] and a[0].data_ptr() != sets[s][0].data_ptr()
            assert a[0].shape == (4, 5) and a[0].is_contiguous()
            seen_ids.add(id(a[0]))
        # the calls of one trial hold distinct memory: no call can see another's buffer
        assert len({a[0].data_ptr() for a in args}) == calls
    assert len(seen_ids) > 1


def test_sets_are_drawn_in_secret_random_order_within_batched_trials() -> None:
    fresh = FreshInputs(_sets(), 8, random.Random(1))
    orders = [tuple(fresh.trial()[1]) for _ in range(30)]
    assert len(set(orders)) > 10  # not a fixed rotation
    # consecutive calls of a trial do not always share a set (caching "the previous call" fails)
    assert any(o[j] != o[j + 1] for o in orders for j in range(7))
    assert {s for o in orders for s in o} == {0, 1, 2}
    # another generator, another order: nothing about it comes from the request
    other = FreshInputs(_sets(), 8, random.Random(2))
    assert [tuple(other.trial()[1]) for _ in range(30)] != orders


def test_tensors_that_cannot_be_pooled_are_cloned_per_call() -> None:
    sets = [[torch.full((3, 4), float(s)).t(), [torch.full((2,), float(s))]] for s in range(2)]
    fresh = FreshInputs(sets, 3, random.Random(0))
    assert fresh.pooled == [False, False]
    args, chosen = fresh.trial()
    for a, s in zip(args, chosen, strict=True):
        assert torch.equal(a[0], sets[s][0]) and a[0].stride() == sets[s][0].stride()
        assert a[0].data_ptr() != sets[s][0].data_ptr()
        assert torch.equal(a[1][0], sets[s][1][0]) and a[1][0] is not sets[s][1][0]


def test_verification_share_and_bounds() -> None:
    v = Verification(rng=random.Random(0), share=0.25, max_kept=3)
    picks = [v.pick(4) for _ in range(400)]
    chosen = [p for p in picks if p is not None]
    assert 60 < len(chosen) < 140 and set(chosen) == {0, 1, 2, 3}
    for _ in range(3):
        v.kept.append((0, None))
    assert v.pick(4, force=True) is None  # at the bound nothing more is kept
    assert Verification.for_output(VERIFIED_BYTES).max_kept == MIN_VERIFIED
    assert Verification.for_output(1).max_kept > MIN_VERIFIED


class _Cheat:
    """Computes the first call of each trial (the host gap before it is long) and, in the
    back-to-back calls after it, returns its cached output: right only when the sets agree."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.cache: torch.Tensor | None = None
        self.last_host = -1.0
        self.host = 0.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.host += 1.0
        back_to_back = self.cache is not None and self.host - self.last_host < 1.5
        self.last_host = self.host
        if back_to_back:
            assert self.cache is not None
            return self.cache
        self.clock.kernel()
        self.cache = x * 2
        return self.cache

    def gap(self) -> None:
        self.host += 10.0


def _timed(monkeypatch: pytest.MonkeyPatch, fn: Any, clock: _Clock, calls: int, seed: int) -> Verification:
    clock.install(monkeypatch)
    sets = [[torch.full((8,), float(s))] for s in range(3)]
    v = Verification(rng=random.Random(seed))
    timing.time_gpu(
        fn, sets, trials=40, warmup=1, device=torch.device("cuda", 0), flush=torch.empty(4),
        verification=v, calls_per_trial=calls, min_warmup_ms=0.0,
    )  # fmt: skip
    for _s, out in v.kept:  # what timing_phase's verify_timed_calls compares
        assert out.shape == (8,)
    return v


def test_time_gpu_keeps_copies_of_randomly_chosen_calls_and_at_least_the_minimum(monkeypatch) -> None:
    clock = _Clock(kernel_ms=0.01, noise=0.0)

    def honest(x: torch.Tensor) -> torch.Tensor:
        clock.kernel()
        return x * 2

    for seed in range(5):
        v = _timed(monkeypatch, honest, clock, 4, seed)
        assert MIN_VERIFIED <= len(v.kept) <= v.max_kept
        assert all(torch.equal(out, torch.full((8,), 2.0 * s)) for s, out in v.kept)


def test_a_cache_used_only_in_back_to_back_calls_is_caught(monkeypatch) -> None:
    clock = _Clock(kernel_ms=0.01, noise=0.0)
    caught = 0
    original = timing._reset_persisting_l2
    for seed in range(10):
        cheat = _Cheat(clock)

        def reset_and_gap(cheat: _Cheat = cheat) -> None:  # the host's gap between trials
            cheat.gap()
            original()

        monkeypatch.setattr(timing, "_reset_persisting_l2", reset_and_gap)
        v = _timed(monkeypatch, cheat, clock, 8, seed)
        caught += any(not torch.equal(out, torch.full((8,), 2.0 * s)) for s, out in v.kept)
    assert caught >= 8  # each kept call of a cheating trial is wrong with probability ~2/3 * 7/8


def test_verification_trials_alone_are_recorded(monkeypatch) -> None:
    clock = _Clock(kernel_ms=0.01, noise=0.0)
    recorded: list[int] = []

    def record(trial: Any) -> tuple[Any, list[str], list[str]]:
        before = clock.kernel_calls
        out = trial()
        recorded.append(clock.kernel_calls - before)
        return out, ["own_kernel"] * (clock.kernel_calls - before), []

    def honest(x: torch.Tensor) -> torch.Tensor:
        clock.kernel()
        return x * 2

    clock.install(monkeypatch)
    v = Verification(rng=random.Random(3), record=record)
    sets = [[torch.full((8,), float(s))] for s in range(3)]
    timing.time_gpu(honest, sets, trials=40, warmup=1, device=torch.device("cuda", 0), flush=torch.empty(4),
                    verification=v, calls_per_trial=4, min_warmup_ms=0.0)  # fmt: skip
    # the first verification trials are recorded, up to MAX_RECORDED
    assert len(recorded) == min(len(v.kept), MAX_RECORDED) and len(v.kept) >= MIN_VERIFIED
    assert v.recorded_calls == 4 * len(recorded) and len(v.names) == sum(recorded) == v.recorded_calls


def _checked(names: list[str], calls: int) -> Verification:
    return Verification(rng=random.Random(0), names=names, recorded_calls=calls)


def test_timed_kernel_checks_reject_skipped_launches_and_foreign_kernels(monkeypatch, tmp_path) -> None:
    from eval_server.pipeline import timing_phase
    from eval_server.pipeline.context import LAUNCHES, EvalContext
    from eval_server.pipeline.verdicts import Stop
    from eval_server.schema import STATUS_OK, EvalResult

    monkeypatch.setattr(LAUNCHES, "launches", Counter({"relu_kernel": 1}))
    ctx = EvalContext(device=torch.device("cpu"), device_label="cpu", workdir=tmp_path, timing_enabled=True)

    def verdict(names: list[str], calls: int) -> list[str]:
        result = EvalResult(status=STATUS_OK)
        try:
            timing_phase.timed_kernel_checks(result, ctx, _checked(names, calls), launches_per_call=1)
        except Stop:
            pass
        return [c.id for c in result.checks]

    assert verdict(["relu_kernel"] * 8 + ["void at::native::direct_copy_kernel_cuda"], 8) == []
    assert verdict(["relu_kernel"] * 7, 8) == ["runtime.timed_launches"]
    mul = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor>>"
    assert verdict(["relu_kernel"] * 8 + [mul], 8) == ["runtime.foreign_kernels"]
    assert verdict([], 0) == []  # nothing recorded (CPU, or the profiler switched off): nothing to hold
    # a launch record naming a function the candidate does not define was forged (here: `void`,
    # which would make ATen's `void at::native::...` kernels the candidate's own)
    ctx.candidate_functions = frozenset({"relu_kernel", "forward"})
    assert verdict(["relu_kernel"] * 8, 8) == []
    monkeypatch.setattr(LAUNCHES, "launches", Counter({"relu_kernel": 1, "void": 1}))
    assert verdict(["relu_kernel"] * 8 + [mul], 8) == ["runtime.evaluator_state"]


@pytest.mark.parametrize(
    ("shape", "dtype"), [((7, 1001), torch.float32), ((3,), torch.float16), ((5, 8), torch.int64)]
)
def test_each_batched_call_is_aligned_like_an_allocation_of_its_own(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """A kernel that vectorizes only on aligned pointers must take the same path when timed as
    when verified: every call's tensor starts CALL_ALIGN_BYTES-aligned within the trial's block
    (7 x 1001 floats back to back put 3 of 4 calls off 16 bytes)."""
    sets = [[torch.arange(int(torch.tensor(shape).prod())).reshape(shape).to(dtype) + s] for s in range(3)]
    fresh = FreshInputs(sets, 8, random.Random(0))
    args, chosen = fresh.trial()
    base = args[0][0].data_ptr()
    for a, s in zip(args, chosen, strict=True):
        t = a[0]
        assert (t.data_ptr() - base) % CALL_ALIGN_BYTES == 0
        assert t.is_contiguous() and t.shape == shape and t.dtype == dtype
        assert torch.equal(t, sets[s][0])
