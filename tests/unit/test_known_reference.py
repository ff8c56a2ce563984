"""The reference timings a worker keeps (eval_server/judge/known.py): what crosses the pipe is
checked, stale entries are refused, and the store stays bounded."""

from __future__ import annotations

import dataclasses
import math

import pytest

from eval_server.judge import known
from eval_server.judge.known import KnownReference, KnownStore
from eval_server.schema import TimingStats

STATS = TimingStats(
    median_ms=0.25, min_ms=0.24, mean_ms=0.251, iqr_ms=0.002, cv=0.01, trials=40, method="gpu-time-batched",
    calls_per_trial=4, lead_ms=0.02,
)  # fmt: skip


def entry(key: str = "k1", measured_at: float = 100.0, cycles: float = 1.98e6) -> KnownReference:
    return KnownReference(key, STATS, 0.11, 0.05, cycles, measured_at)


PRECISION = {"ref_error": 1.2e-7, "budget": 1.2e-7, "ref_scale": 3.5, "dtype": "float32"}


@pytest.mark.parametrize("facts", [None, {}, PRECISION])
@pytest.mark.parametrize("compiled", [None, dataclasses.replace(STATS, median_ms=0.2, min_ms=0.19, mean_ms=0.2)])
def test_an_entry_crosses_the_pipe_unchanged(facts: dict | None, compiled: TimingStats | None) -> None:
    """With the judge's precision facts: not recorded (None), none for the problem ({}), or numbers;
    with the compiled reference's timing (options.baseline_compile) or without."""
    e = dataclasses.replace(entry(), precision=facts, compiled=compiled)
    assert KnownReference.from_json(e.to_json()) == e


@pytest.mark.parametrize(
    "change",
    [
        {"key": 3},
        {"pre_ms": math.nan},
        {"cycles_per_ms": math.inf},
        {"cycles_per_ms": 0},
        {"measured_at": "100"},
        {"stats": {**dataclasses.asdict(STATS), "median_ms": 0.0}},
        {"stats": {**dataclasses.asdict(STATS), "median_ms": math.nan}},
        {"stats": {**dataclasses.asdict(STATS), "calls_per_trial": True}},
        {"stats": {**dataclasses.asdict(STATS), "method": None}},
        {"stats": {**dataclasses.asdict(STATS), "speedup": 9.0}},
        {"stats": [0.25]},
        {"precision": {**PRECISION, "budget": math.nan}},
        {"precision": {**PRECISION, "ref_error": -1.0}},
        {"precision": {**PRECISION, "dtype": None}},
        {"precision": {**PRECISION, "extra": 1.0}},
        {"precision": [1.0]},
        {"compiled": {**dataclasses.asdict(STATS), "median_ms": -1.0}},
        {"compiled": {**dataclasses.asdict(STATS), "method": None}},
        {"compiled": 0.2},
    ],
)
def test_a_malformed_entry_is_refused(change: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        KnownReference.from_json({**entry().to_json(), **change})


def test_an_entry_is_stale_when_old_or_when_the_gpu_clock_moved() -> None:
    e = entry(measured_at=100.0, cycles=2.0e6)
    assert e.stale(now=160.0, max_age_s=600, cycles_per_ms=2.0e6) is None
    assert e.stale(now=160.0, max_age_s=600, cycles_per_ms=2.0e6 * (1 + known.CLOCK_DRIFT / 2)) is None
    assert "more than 30 s" in (e.stale(now=160.0, max_age_s=30, cycles_per_ms=2.0e6) or "")
    assert e.stale(now=99.0, max_age_s=600, cycles_per_ms=2.0e6) is not None  # from another clock
    moved = e.stale(now=160.0, max_age_s=600, cycles_per_ms=1.9e6)
    assert moved is not None and "clock moved 5.0%" in moved
    assert e.stale(now=160.0, max_age_s=600, cycles_per_ms=math.nan) is not None


def test_find_takes_the_entry_of_the_key_and_skips_malformed_ones() -> None:
    given = [{"key": "k2"}, entry("k1").to_json(), entry("k2").to_json()]
    assert known.find(given, "k2") == entry("k2")
    assert known.find(given, "k3") is None
    assert known.find("not a list", "k1") is None


def test_the_store_keeps_the_newest_entry_per_key_and_forgets_old_problems() -> None:
    store = KnownStore(problems=2)
    assert store.entries("p1") == []
    assert store.learn("p1", entry("k1", measured_at=1.0).to_json())
    assert store.learn("p1", entry("k1", measured_at=2.0).to_json())
    assert [e["measured_at"] for e in store.entries("p1")] == [2.0]
    for i in range(known.KEYS_PER_PROBLEM + 2):
        store.learn("p1", entry(f"x{i}").to_json())
    assert len(store.entries("p1")) == known.KEYS_PER_PROBLEM
    store.learn("p2", entry().to_json())
    store.entries("p1")  # used: p2 is now the oldest
    store.learn("p3", entry().to_json())
    assert store.entries("p2") == [] and store.entries("p1") and store.entries("p3")
    assert not store.learn("p4", {"key": "k"}) and store.entries("p4") == []
