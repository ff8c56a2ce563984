"""eval_server.checks.close_kernel agrees with compare's torch path on a GPU, bf16 included, and
compare_outputs uses it there. Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_close_kernel_gpu.py`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_kernel_matches_the_torch_path_on_every_case() -> None:
    from tests.close_kernel_cases import run

    rows = run("cuda", (torch.float32, torch.float16, torch.bfloat16))
    assert len(rows) >= 60
    differ = [r for r in rows if r["torch"] != r["kernel"]]
    assert differ == [], "\n".join(map(str, differ))


def test_compare_outputs_takes_the_kernel_on_a_large_output(monkeypatch: pytest.MonkeyPatch) -> None:
    from eval_server.checks import close_kernel, compare

    calls = []
    original = close_kernel.close_stats
    monkeypatch.setattr(close_kernel, "close_stats", lambda *a: calls.append(1) or original(*a))
    ref = torch.randn(1 << 26, device="cuda")  # 64 M elements, 16384 blocks
    cand = ref.clone()
    cand[-1] += 1.0
    assert not compare.compare_outputs(ref, cand, "default").passed
    assert compare.compare_outputs(ref, ref.clone(), "default").passed
    assert len(calls) == 2
