"""time_gpu on a real GPU: segments relocate the inputs and discard each segment's first trial."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture
def device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", 0)


def test_segments_relocate_inputs_and_count_trials(device: torch.device) -> None:
    from eval_server.timing import time_gpu

    seen: set[int] = set()

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.add(x.data_ptr())
        return x * 2

    sets = [[torch.randn(1 << 20, device=device)] for _ in range(2)]
    last: dict[int, torch.Tensor] = {}
    stats = time_gpu(fn, sets, trials=40, warmup=1, device=device, segments=4, last_outputs=last, min_warmup_ms=0)
    assert stats.trials == 36  # 4 segments of 10, first of each discarded
    assert len(seen) == 8  # 2 sets x 4 placements
    for k, out in last.items():
        torch.testing.assert_close(out, sets[k][0] * 2)
    # Above the relocation cap the same buffers are reused (only the cache is emptied).
    seen.clear()
    time_gpu(fn, sets, trials=8, warmup=1, device=device, segments=4, relocate_max_bytes=0, min_warmup_ms=0)
    assert len(seen) == 2
