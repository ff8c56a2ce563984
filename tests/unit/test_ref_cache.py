"""RefTimingCache: hits, misses on any key change, persistence across connections/processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from eval_server.pipeline.ref_cache import RefTimingCache, cache_key
from eval_server.schema import TimingStats

pytestmark = pytest.mark.unit

KEY = {"problem": "abc", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "inputs": ["(4, 4):torch.float32"],
       "seed": 42, "timing_trials": 100, "warmup_trials": 3, "input_sets": 3}  # fmt: skip
STATS = TimingStats(
    median_ms=1.5, min_ms=1.4, mean_ms=1.55, iqr_ms=0.05, cv=0.01, trials=99, wall_median_ms=1.6
)


def test_put_get_round_trip_and_survives_reopen(tmp_path):
    path = tmp_path / "sub" / "ref.sqlite"
    cache = RefTimingCache(path)
    assert cache.get(KEY) is None
    cache.put(KEY, STATS)
    assert cache.get(KEY) == STATS
    cache.close()
    reopened = RefTimingCache(path)  # a server restart
    assert reopened.get(KEY) == STATS
    assert len(reopened) == 1


@pytest.mark.parametrize("part", sorted(KEY))
def test_any_key_part_change_is_a_miss(tmp_path, part):
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    cache.put(KEY, STATS)
    changed = dict(KEY)
    changed[part] = ["other"] if isinstance(KEY[part], list) else f"{KEY[part]}-changed"
    assert cache.get(changed) is None
    assert cache_key(changed) != cache_key(KEY)


def test_key_is_order_independent():
    assert cache_key(dict(reversed(list(KEY.items())))) == cache_key(KEY)


def test_replace_updates_entry(tmp_path):
    cache = RefTimingCache(tmp_path / "ref.sqlite")
    cache.put(KEY, STATS)
    newer = TimingStats(median_ms=2.0, min_ms=1.9, mean_ms=2.0, iqr_ms=0.1, cv=0.02, trials=99)
    cache.put(KEY, newer)
    assert cache.get(KEY) == newer and len(cache) == 1


def test_corrupt_entry_is_a_miss(tmp_path):
    path = tmp_path / "ref.sqlite"
    cache = RefTimingCache(path)
    cache.put(KEY, STATS)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE ref_timing SET stats = ?", ('{"median_ms": 1}',))
    assert cache.get(KEY) is None


def _writer(path: str, i: int) -> None:
    cache = RefTimingCache(path)
    for j in range(20):
        cache.put({**KEY, "problem": f"p{i}-{j}"}, STATS)


def test_concurrent_writers_from_several_processes(tmp_path):
    path = str(tmp_path / "ref.sqlite")
    RefTimingCache(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(RefTimingCache(path)) == 60


def _open_and_write_at(path: str, start: float, i: int, results: mp.Queue) -> None:
    import time

    while time.time() < start:  # all processes open the fresh file at the same moment
        pass
    try:
        cache = RefTimingCache(path)
        cache.put_facts({**KEY, "seed": i}, {"n": i})
        cache.close()
        results.put("ok")
    except sqlite3.Error as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_fresh_file_at_once_all_succeed(tmp_path):
    """A new server's first evaluations open the fresh cache file from several processes at once;
    SQLite refused some of them at once ("database is locked") before the open retried."""
    import time

    ctx = mp.get_context("fork")
    for n in range(15):
        path = str(tmp_path / f"fresh-{n}.sqlite")
        results = ctx.Queue()
        start = time.time() + 0.2
        procs = [ctx.Process(target=_open_and_write_at, args=(path, start, i, results)) for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [results.get(timeout=5) for _ in procs] == ["ok"] * 4
        cache = RefTimingCache(path)
        assert all(cache.get_facts({**KEY, "seed": i}) == {"n": i} for i in range(4))
        cache.close()
