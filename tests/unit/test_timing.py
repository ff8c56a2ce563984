"""Unit tests of eval_server.pipeline.timing.summarize (the statistics every timing reports)."""

from __future__ import annotations

import math
import random

import pytest

from eval_server.pipeline.timing import summarize
from eval_server.schema import TimingStats

pytestmark = pytest.mark.unit


def test_four_values_exact():
    s = summarize([4.0, 1.0, 3.0, 2.0])  # order must not matter
    assert isinstance(s, TimingStats)
    assert s.median_ms == 2.5
    assert s.min_ms == 1.0
    assert s.mean_ms == 2.5
    # inclusive quartiles of 1..4: 1.75 and 3.25
    assert s.iqr_ms == pytest.approx(1.5)
    assert s.cv == pytest.approx(math.sqrt(1.25) / 2.5)  # population std / mean
    assert s.trials == 4


def test_odd_count_median_and_iqr():
    s = summarize([10.0, 1.0, 2.0, 3.0, 4.0])
    assert s.median_ms == 3.0
    assert s.min_ms == 1.0
    assert s.mean_ms == 4.0
    assert s.iqr_ms == pytest.approx(4.0 - 2.0)
    assert s.trials == 5


def test_median_is_robust_to_an_outlier():
    s = summarize([1.0] * 9 + [1000.0])
    assert s.median_ms == 1.0
    assert s.iqr_ms == 0.0
    assert s.mean_ms == pytest.approx(100.9)
    assert s.cv > 2.0


def test_single_value():
    s = summarize([2.5])
    assert s == TimingStats(median_ms=2.5, min_ms=2.5, mean_ms=2.5, iqr_ms=0.0, cv=0.0, trials=1)


def test_constant_values_have_zero_spread():
    s = summarize([0.7] * 20)
    assert (s.median_ms, s.min_ms, s.iqr_ms, s.cv, s.trials) == (0.7, 0.7, 0.0, 0.0, 20)
    assert s.mean_ms == pytest.approx(0.7)


def test_all_zero_times_do_not_divide_by_zero():
    s = summarize([0.0, 0.0, 0.0])
    assert s.cv == 0.0 and s.median_ms == 0.0


def test_input_not_mutated_and_tuple_accepted():
    xs = [3.0, 1.0, 2.0]
    summarize(xs)
    assert xs == [3.0, 1.0, 2.0]
    assert summarize((3.0, 1.0, 2.0)).median_ms == 2.0


def test_matches_reference_formulas_on_random_data():
    rng = random.Random(0)
    xs = [rng.uniform(0.5, 2.0) for _ in range(101)]
    s = summarize(xs)
    ys = sorted(xs)
    assert s.median_ms == ys[50]
    assert s.min_ms == ys[0]
    assert s.iqr_ms == pytest.approx(ys[75] - ys[25])  # inclusive quartiles land on elements for n = 4k + 1
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    assert s.mean_ms == pytest.approx(mean)
    assert s.cv == pytest.approx(std / mean)


def test_result_is_json_ready():
    s = summarize([1.0, 2.0])
    assert all(isinstance(getattr(s, f), float) for f in ("median_ms", "min_ms", "mean_ms", "iqr_ms", "cv"))
    assert isinstance(s.trials, int)
