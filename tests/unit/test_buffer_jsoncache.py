"""Unit tests of buffer_server.store.jsoncache: the byte bound, and 'full' meaning no room for one
more entry of the usual size (the preparer's signal to stop looking for work)."""

from __future__ import annotations

import pytest

from buffer_server.store.jsoncache import JsonCache

pytestmark = pytest.mark.unit


def test_bound_room_and_hits() -> None:
    cache = JsonCache(max_bytes=350)
    assert cache.has_room()
    assert cache.put(1, b"a" * 100) and cache.put(2, b"b" * 100) and cache.put(3, b"c" * 100)
    assert not cache.put(4, b"d" * 100)  # 400 > 350: refused
    # 300 of 350 bytes: below the bound, but no room for another 100-byte entry
    assert not cache.has_room()
    assert cache.pop(2) == b"b" * 100 and cache.pop(2) is None
    assert cache.has_room()
    cache.discard([1, 99])
    assert cache.keys() == [3]
    assert cache.stats() == {"records": 1, "bytes": 100, "max_bytes": 350, "hits": 1, "misses": 1}
    assert cache.size_hint() == (1, 2)  # 250 bytes left: two more 100-byte entries


def test_a_put_of_a_known_seq_is_refused() -> None:
    cache = JsonCache(max_bytes=1000)
    assert cache.size_hint() == (0, 256)
    assert cache.put(1, b"x")
    assert not cache.put(1, b"y")
    assert cache.pop(1) == b"x"
