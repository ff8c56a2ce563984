"""physics_floor: the device table and the arithmetic of the floor."""

from __future__ import annotations

import pytest

from eval_server.checks.physics_floor import DevicePeak, floor_for, peak_for


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_known_devices_match_their_own_entry(name: str, expected: str) -> None:
    peak = peak_for(name)
    assert peak is not None and peak.name == expected


def test_unknown_device_has_no_peak() -> None:
    assert peak_for("Tesla V100-SXM2-16GB") is None
    assert peak_for("cpu") is None


PEAK = DevicePeak("test", bandwidth_gbs=1000, tensor_tflops=100)  # 1.25 TB/s, 125 TFLOP/s with headroom


def test_memory_floor_counts_inputs_and_outputs_beyond_l2() -> None:
    mib = 1 << 20
    floor = floor_for(input_bytes=64 * mib, output_bytes=64 * mib, l2_bytes=50 * mib, flops=0, peak=PEAK)
    assert floor.bytes_moved == 78 * mib
    assert floor.memory_us == pytest.approx(78 * mib / 1.25e12 * 1e6)  # 65.4 us
    assert floor.compute_us == 0.0 and floor.floor_us == floor.memory_us
    small_out = floor_for(64 * mib, 4 * mib, 50 * mib, 0, PEAK)  # the output may stay in L2
    assert small_out.bytes_moved == 64 * mib


def test_compute_floor_wins_for_a_large_matmul() -> None:
    n = 4096
    flops = 2 * n**3  # what FlopCounterMode reports for an n x n x n matmul
    floor = floor_for(2 * n * n * 4, n * n * 4, 50 << 20, flops, PEAK)
    assert floor.compute_us == pytest.approx(flops / 125e12 * 1e6)  # 1100 us
    assert floor.floor_us == floor.compute_us > floor.memory_us


def test_describe_names_every_number_behind_the_floor() -> None:
    text = floor_for(100_000_000, 0, 0, 2_000_000_000, PEAK).describe()
    assert (
        "100 MB must move through memory, at most 1250 GB/s (test peak 1000 GB/s x 1.25 headroom): 80 us"
        in text
    )
    assert "2 GFLOP at most 125 TFLOP/s (peak 100 x 1.25): 16 us" in text


def test_the_reference_forward_counts_its_flops_and_returns_its_output() -> None:
    """The reference phase's one forward also gives the FLOP count (no second forward)."""
    import torch

    from eval_server.pipeline.reference import forward_counting_flops

    linear, x = torch.nn.Linear(64, 32), torch.randn(8, 64)
    out, flops = forward_counting_flops(linear, [x])
    assert torch.equal(out, linear(x)) and flops == 2 * 8 * 64 * 32
    out, flops = forward_counting_flops(torch.nn.ReLU(), [x])
    assert torch.equal(out, torch.relu(x)) and flops == 0
