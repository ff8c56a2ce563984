"""persisting_l2: finding the loaded CUDA runtime, and what a reset does with each answer of the
library (the library itself is exercised on GPU: tests/gpu/test_persisting_l2_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server.checks import persisting_l2


def test_loaded_libraries_reads_mapped_files_by_name_prefix(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f10 r--p 00000000 08:01 11 /opt/nvidia/cu13/lib/libcudart.so.13\n"
        "7f10-7f20 r-xp 00001000 08:01 11 /opt/nvidia/cu13/lib/libcudart.so.13\n"
        "7f20-7f30 r--p 00000000 08:01 12 /usr/lib/libcudart_static_helper.a\n"
        "7f30-7f40 rw-p 00000000 00:00 0 \n"
        "7f40-7f50 r--p 00000000 08:01 13 /usr/lib/libc.so.6\n"
        "7f50-7f60 r--p 00000000 00:00 0 [heap]\n",
        encoding="utf-8",
    )
    assert persisting_l2.loaded_libraries("libcudart", str(maps)) == ["/opt/nvidia/cu13/lib/libcudart.so.13"]
    assert persisting_l2.loaded_libraries("libcudart", str(tmp_path / "missing")) == []


class _FakeLibrary:
    """Answers like the CUDA runtime would: a limit, and error codes chosen by the test."""

    def __init__(self, limit: int, set_err: int = 0, reset_err: int = 0) -> None:
        self.limit, self.set_err, self.reset_err = limit, set_err, reset_err
        self.calls: list[str] = []

    def api(self) -> persisting_l2._Api:
        def set_limit(n: int) -> int:
            self.calls.append(f"set {n}")
            if not self.set_err:
                self.limit = n
            return self.set_err

        def reset_lines() -> int:
            self.calls.append("reset")
            return self.reset_err

        return persisting_l2._Api(lambda: self.limit, set_limit, reset_lines, "fake")


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(persisting_l2, "STATE", persisting_l2.ResetState())

    def install(lib: _FakeLibrary | None) -> None:
        monkeypatch.setattr(persisting_l2, "_RESOLVED", {} if lib is None else {"api": lib.api()})

    return install


def test_reset_sets_the_limit_to_zero_only_when_set_and_always_resets_lines(fresh_state) -> None:
    lib = _FakeLibrary(limit=0)
    fresh_state(lib)
    persisting_l2.reset()
    assert lib.calls == ["reset"]
    lib.limit = 4 << 20  # someone set a set-aside between two trials
    persisting_l2.reset()
    assert lib.calls == ["reset", "set 0", "reset"] and lib.limit == 0
    state = persisting_l2.STATE
    assert (state.resets, state.found_limit_bytes, state.note) == (2, 4 << 20, None)


def test_the_first_reset_of_a_process_takes_the_context_default_as_its_own(fresh_state) -> None:
    """A set-aside the context starts with (read during the reference's timing, before any
    candidate code) is reset but not reported; one found after that is."""
    lib = _FakeLibrary(limit=11796480)  # what an H200's context reported before any candidate
    fresh_state(lib)
    persisting_l2.reset()
    state = persisting_l2.STATE
    assert lib.limit == 0 and (state.initial_limit_bytes, state.found_limit_bytes) == (11796480, 0)
    persisting_l2.reset()
    assert state.found_limit_bytes == 0
    lib.limit = 1 << 20
    persisting_l2.reset()
    assert state.found_limit_bytes == 1 << 20


@pytest.mark.parametrize(
    ("lib", "expected"),
    [
        (_FakeLibrary(limit=-801), "cannot read the persisting-L2 limit through fake (CUDA error 801)"),
        (_FakeLibrary(limit=1 << 20, set_err=1), "failed with CUDA error 1"),
        (_FakeLibrary(limit=0, reset_err=700), "failed with CUDA error 700"),
    ],
)
def test_a_failing_library_leaves_a_note_and_never_raises(
    fresh_state, lib: _FakeLibrary, expected: str
) -> None:
    fresh_state(lib)
    persisting_l2.reset()
    assert expected in (persisting_l2.STATE.note or "")
    assert persisting_l2.STATE.resets == 0


def test_no_cuda_library_is_a_note(fresh_state, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_state(None)
    monkeypatch.setattr(persisting_l2, "loaded_libraries", lambda prefix: [])

    def no_driver() -> persisting_l2._Api:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(persisting_l2, "_driver_api", no_driver)
    persisting_l2.reset()
    assert persisting_l2.STATE.note == (
        "persisting-L2 reset unavailable (driver API: libcuda.so.1: cannot open shared object file)"
    )
