"""The physics floor: a time below what the device can do for the problem's work is impossible.

A candidate whose timed calls skip the work (results replayed from an earlier call, keyed so that
the refill checks still see fresh results: FIELD_NOTES 2026, KernelGuard) can pass every output
check; its time cannot beat memory bandwidth and math throughput. The floor is
max(bytes / peak bandwidth, FLOPs / peak tensor FLOP/s), both peaks times a headroom, for:

- bytes: every input the problem gets (flushed from L2 before each trial, so read from memory)
  plus the part of the outputs larger than L2 (a smaller output may stay in the write-back L2
  until after the call);
- FLOPs: what torch's FlopCounterMode counts in one reference forward (matmuls, convolutions,
  attention; elementwise work is not counted, which only lowers the floor).

Peaks come from a table of known devices (vendor figures, the larger where variants differ: a
floor that errs low never rejects an honest kernel); an unknown device has no floor. The
reference itself must respect the floor: if it does not, this problem breaks an assumption
(e.g. an input it never reads) and the floor is not applied.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADROOM = 1.25  # peaks are multiplied by this before computing the floor
MIN_FLOOR_US = 5.0  # below this, event resolution and launch latency dominate: no floor


@dataclass(frozen=True)
class DevicePeak:
    name: str
    bandwidth_gbs: float  # peak memory bandwidth, GB/s (1e9 bytes/s)
    tensor_tflops: float  # dense fp16/bf16 tensor-core peak, TFLOP/s (above every fp32 path)


# Matched in order against the lower-cased device name: more specific names first.
PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    ("gh200", DevicePeak("GH200", 4900, 989)),
    ("h200 nvl", DevicePeak("H200 NVL", 4800, 835)),
    ("h200", DevicePeak("H200 SXM", 4800, 989)),
    ("h100 pcie", DevicePeak("H100 PCIe", 2000, 756)),
    ("h100 nvl", DevicePeak("H100 NVL", 3900, 835)),
    ("h100", DevicePeak("H100 SXM", 3350, 989)),
    ("a100", DevicePeak("A100", 2039, 312)),
    ("l40s", DevicePeak("L40S", 864, 362)),
    ("l40", DevicePeak("L40", 864, 181)),
    ("nvidia l4", DevicePeak("L4", 300, 121)),
    ("b200", DevicePeak("B200", 8000, 2250)),
    ("rtx 4090", DevicePeak("RTX 4090", 1008, 330)),
)


def peak_for(device_name: str) -> DevicePeak | None:
    """The table entry for `device_name` (torch.cuda.get_device_name), None when unknown."""
    lowered = device_name.lower()
    return next((peak for key, peak in PEAKS if key in lowered), None)


@dataclass(frozen=True)
class Floor:
    bytes_moved: int
    flops: int
    peak: DevicePeak

    @property
    def memory_us(self) -> float:
        return self.bytes_moved / (self.peak.bandwidth_gbs * 1e9 * HEADROOM) * 1e6

    @property
    def compute_us(self) -> float:
        return self.flops / (self.peak.tensor_tflops * 1e12 * HEADROOM) * 1e6

    @property
    def floor_us(self) -> float:
        return max(self.memory_us, self.compute_us)

    def describe(self) -> str:
        """The numbers behind the floor, for feedback."""
        text = (
            f"{self.bytes_moved / 1e6:.4g} MB must move through memory, at most "
            f"{self.peak.bandwidth_gbs * HEADROOM:.0f} GB/s ({self.peak.name} peak "
            f"{self.peak.bandwidth_gbs:.0f} GB/s x {HEADROOM:g} headroom): {self.memory_us:.3g} us"
        )
        if self.flops:
            text += (
                f"; {self.flops / 1e9:.4g} GFLOP at most {self.peak.tensor_tflops * HEADROOM:.0f} TFLOP/s "
                f"(peak {self.peak.tensor_tflops:.0f} x {HEADROOM:g}): {self.compute_us:.3g} us"
            )
        return text


def floor_for(
    input_bytes: int, output_bytes: int, l2_bytes: int, flops: int, peak: DevicePeak, calls_per_trial: int = 1
) -> Floor:
    """The floor of one call: inputs from memory, outputs beyond L2 to memory, FLOPs (see above).
    Batched timing (calls_per_trial > 1, timing.py) flushes L2 only before a trial's first call,
    so later calls may find their inputs in L2: then only what does not fit in L2 counts."""
    if calls_per_trial > 1:
        return Floor(max(0, input_bytes + output_bytes - l2_bytes), max(0, flops), peak)
    return Floor(input_bytes + max(0, output_bytes - l2_bytes), max(0, flops), peak)


def roofline(
    input_bytes: int, output_bytes: int, flops: int, peak: DevicePeak, time_us: float
) -> dict[str, object] | None:
    """Achieved memory throughput and FLOP/s of one call that took `time_us`, against the peaks
    (no headroom: this is how close the kernel came, not a bound); None without a time or bytes."""
    moved = input_bytes + output_bytes
    if time_us <= 0 or moved <= 0:
        return None
    gbs = moved / (time_us * 1e-6) / 1e9
    out: dict[str, object] = {
        "device": peak.name,
        "gbs": round(gbs, 2),
        "bandwidth_share": round(gbs / peak.bandwidth_gbs, 4),
    }
    if flops > 0:
        tflops = flops / (time_us * 1e-6) / 1e12
        out.update(tflops=round(tflops, 3), compute_share=round(tflops / peak.tensor_tflops, 4))
    return out
