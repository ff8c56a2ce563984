"""The per-trial persisting-L2 reset (eval_server/checks/persisting_l2.py) on a real GPU.

Candidates cannot set a persisting window (ctypes and cuda-python are forbidden statically: the
persisting_l2_* corpus cases), so the harness sets one itself, the way a candidate would, and
checks that timing undoes it. Run: `python -m pytest -m gpu tests/gpu/test_persisting_l2_gpu.py -s`.
"""

from __future__ import annotations

import ctypes

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server.checks import persisting_l2  # noqa: E402
from eval_server.pipeline import timing  # noqa: E402

WINDOW_BYTES = 16 << 20  # below the persisting maximum of A100/H100/H200 (30+ MiB)


class _Window(ctypes.Structure):
    """cudaAccessPolicyWindow inside the 64-byte cudaStreamAttrValue / CUstreamAttrValue union."""

    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hit_ratio", ctypes.c_float),
        ("hit_prop", ctypes.c_int),
        ("miss_prop", ctypes.c_int),
        ("pad", ctypes.c_char * 36),
    ]


def _stream_set_attribute(window: _Window) -> None:
    """Set the access-policy window of the current stream, through the library persisting_l2 uses."""
    runtime = persisting_l2.loaded_libraries("libcudart")
    lib = ctypes.CDLL(runtime[0] if runtime else "libcuda.so.1")
    set_attr = lib.cudaStreamSetAttribute if runtime else lib.cuStreamSetAttribute
    set_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    stream = torch.cuda.current_stream().cuda_stream
    assert set_attr(stream, 1, ctypes.byref(window)) == 0  # 1: access policy window


def _set_window(x: torch.Tensor) -> None:
    """A persisting set-aside of x's size and a window over x (hit: persisting, miss: streaming)."""
    api = persisting_l2.api()
    assert api is not None
    nbytes = x.numel() * x.element_size()
    assert api.set_limit(nbytes) == 0
    _stream_set_attribute(_Window(x.data_ptr(), nbytes, 1.0, 2, 1))


def _clear_window() -> None:
    _stream_set_attribute(_Window(0, 0, 0.0, 0, 0))
    persisting_l2.reset()


def test_the_reset_is_available_here() -> None:
    torch.cuda.init()
    persisting_l2.reset()
    assert persisting_l2.api() is not None, persisting_l2.STATE.note
    assert persisting_l2.STATE.note is None
    assert persisting_l2.api().get_limit() == 0


def test_timing_resets_a_set_aside_made_between_trials() -> None:
    """A set-aside made by the code being timed is back to 0 before the next trial."""
    api = persisting_l2.api()
    assert api is not None
    device = torch.device("cuda", 0)
    x = torch.randn(WINDOW_BYTES // 4, device=device)
    made: list[int] = []

    def call(t: torch.Tensor) -> torch.Tensor:
        made.append(api.get_limit())  # what the previous call left: always 0 after a reset
        assert api.set_limit(4 << 20) == 0
        return t.sum()

    before = persisting_l2.STATE.resets
    timing.time_gpu(call, [[x]], trials=8, warmup=1, device=device, min_warmup_ms=0.0)
    assert persisting_l2.STATE.resets - before >= 8
    assert made[-8:] == [0] * 8, made  # timed trials: each one found the set-aside reset
    assert persisting_l2.STATE.found_limit_bytes >= 4 << 20
    assert api.get_limit() >= 4 << 20  # the last call's set-aside: reset before the next timing
    persisting_l2.reset()
    assert api.get_limit() == 0


def test_a_persisting_window_does_not_survive_into_the_next_trial() -> None:
    """Reading a buffer under a persisting window (set on every call, as an exploit would) is no
    faster than reading it plainly: the reset before each flush turns its lines back to normal.
    Without the reset (patched out here) the same read is expected to be faster: printed."""
    device = torch.device("cuda", 0)
    sets = [[torch.randn(WINDOW_BYTES // 4, device=device)] for _ in range(3)]

    def plain(t: torch.Tensor) -> torch.Tensor:
        return t.sum()

    def windowed(t: torch.Tensor) -> torch.Tensor:
        _set_window(t)
        return t.sum()

    def median(fn) -> float:
        return timing.time_gpu(fn, sets, trials=60, warmup=3, device=device).median_ms

    try:
        base = median(plain)
        defended = median(windowed)
        original = timing._reset_persisting_l2
        timing._reset_persisting_l2 = lambda: None
        try:
            undefended = median(windowed)
        finally:
            timing._reset_persisting_l2 = original
    finally:
        _clear_window()
    print(
        f"\n16 MiB read: plain {base * 1e3:.2f} us, persisting window with the reset {defended * 1e3:.2f} us, "
        f"without it {undefended * 1e3:.2f} us"
    )
    assert defended >= 0.9 * base, (base, defended, undefended)
