"""Unit tests of buffer_server.store.bodylog: bodies come back as written, segments rotate, a reopened
log never appends to an old segment (a torn tail is never read), and only inactive segments are
deleted."""

from __future__ import annotations

import os

import pytest

from buffer_server.store.bodylog import BodyLog, BodyLogError

pytestmark = pytest.mark.unit


def test_bodies_come_back_as_written(tmp_path) -> None:
    log = BodyLog(tmp_path / "b", segment_bytes=1 << 20)
    bodies = [os.urandom(n) for n in (1, 40_000, 0, 7)]
    locations = log.append(bodies)
    assert [seg for seg, _ in locations] == [1, 1, 1, 1]
    for (seg, off), body in zip(locations, bodies, strict=True):
        assert log.read(seg, off, len(body)) == body
    assert log.append([]) == []
    log.close()


def test_many_buffers_in_one_append(tmp_path) -> None:
    log = BodyLog(tmp_path / "b")
    bodies = [bytes([i % 256]) * (i + 1) for i in range(1500)]  # more than one writev
    for (seg, off), body in zip(log.append(bodies), bodies, strict=True):
        assert log.read(seg, off, len(body)) == body
    log.close()


def test_segments_rotate_and_only_inactive_ones_are_removed(tmp_path) -> None:
    log = BodyLog(tmp_path / "b", segment_bytes=100)
    first = log.append([b"x" * 150])
    second = log.append([b"y" * 10])
    assert first[0][0] == 1 and second[0][0] == 2 and log.active == 2
    assert log.segments() == [1, 2]
    assert log.remove([1, 2]) == [1]  # the active segment stays
    assert log.segments() == [2]
    with pytest.raises(BodyLogError):
        log.read(1, 0, 150)
    assert log.disk_bytes() == 10
    log.close()


def test_a_reopened_log_starts_a_new_segment(tmp_path) -> None:
    log = BodyLog(tmp_path / "b")
    ((seg, off),) = log.append([b"acknowledged"])
    log.close()
    with open(log.path(seg), "ab") as f:  # a torn write left by a crash
        f.write(b"half a bo")
    reopened = BodyLog(tmp_path / "b")
    ((seg2, off2),) = reopened.append([b"next"])
    assert (seg2, off2) == (seg + 1, 0)
    assert reopened.read(seg, off, 12) == b"acknowledged"
    assert reopened.read(seg2, 0, 4) == b"next"
    reopened.close()


def test_a_short_read_is_an_error(tmp_path) -> None:
    log = BodyLog(tmp_path / "b")
    ((seg, off),) = log.append([b"abc"])
    with pytest.raises(BodyLogError, match="truncated"):
        log.read(seg, off, 10)
    log.close()
