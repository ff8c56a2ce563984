"""The physics floor's table against the GPU it runs on (eval_server/checks/physics_floor.py).

The floor rejects times below bytes / (peak x headroom); it must never reject an honest kernel,
so the best copy bandwidth measured here must stay below the table's peak x headroom (and a
memory-bound copy can only reach the floor, never beat it). The corpus cases
sampled_content_cache (rejected by the floor) and relu_64mib (ok) run in test_exploits_gpu.py.
Run: `python -m pytest -m gpu tests/gpu/test_physics_floor_gpu.py -s`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from eval_server.checks import physics_floor  # noqa: E402


def test_this_gpu_is_in_the_table() -> None:
    name = torch.cuda.get_device_name(0)
    assert physics_floor.peak_for(name) is not None, f"{name}: add it to physics_floor.PEAKS"


def test_measured_copy_bandwidth_stays_below_the_floor_bandwidth() -> None:
    device = torch.device("cuda", 0)
    peak = physics_floor.peak_for(torch.cuda.get_device_name(0))
    assert peak is not None
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    nbytes = 1 << 30
    src = [torch.randn(nbytes // 4, device=device) for _ in range(2)]
    dst = torch.empty_like(src[0])
    times = []
    for i in range(55):  # the best of 50 after 5 warm-up copies, each between CUDA events
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src[i % 2])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    best_ms = min(times[5:])
    floor = physics_floor.floor_for(nbytes, nbytes, l2, 0, peak)
    measured_gbs = 2 * nbytes / (best_ms * 1e-3) / 1e9
    print(f"\n{peak.name}: copy {measured_gbs:.0f} GB/s (best of 50), table {peak.bandwidth_gbs:.0f} GB/s")
    assert measured_gbs < peak.bandwidth_gbs * physics_floor.HEADROOM
    assert best_ms * 1e3 > floor.floor_us, (best_ms, floor.floor_us)
