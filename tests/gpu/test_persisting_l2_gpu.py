"""The per-trial persisting-L2 reset (eval_server/checks/persisting_l2.py) on a real GPU.

Candidates cannot set a persisting window (ctypes and cuda-python are forbidden statically: the
persisting_l2_* corpus cases); the judge resets it before every window
(judge/gpu_calls.py). Here: the reset is available on this GPU and undoes a set-aside. Run: `python -m pytest -m gpu tests/gpu/test_persisting_l2_gpu.py -s`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server.checks import persisting_l2  # noqa: E402

WINDOW_BYTES = 16 << 20  # below the persisting maximum of A100/H100/H200 (30+ MiB)


def test_the_reset_is_available_here() -> None:
    torch.cuda.init()
    persisting_l2.reset()
    assert persisting_l2.api() is not None, persisting_l2.STATE.note
    assert persisting_l2.STATE.note is None
    assert persisting_l2.api().get_limit() == 0


def test_the_reset_undoes_a_set_aside() -> None:
    api = persisting_l2.api()
    assert api is not None
    assert api.set_limit(WINDOW_BYTES) == 0 and api.get_limit() >= WINDOW_BYTES
    persisting_l2.reset()
    assert api.get_limit() == 0
