"""Output pairs on which eval_server.checks.close_kernel must agree with compare's torch path.

Shared by tests/unit/test_close_kernel.py (run here under TRITON_INTERPRET=1 in a subprocess:
the interpreter switch is read when triton is imported) and tests/gpu/test_close_kernel_gpu.py.
`python -m tests.close_kernel_cases DEVICE` prints one JSON line per case: its name, the torch
path's (passed, max_abs, max_rel) and the kernel's.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator

import torch

TOL = 1e-4


def cases(dtypes: tuple[torch.dtype, ...]) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, reference, candidate); sizes straddle the kernel's 4096-element block."""
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        tag = str(dtype).removeprefix("torch.")
        for n in (1, 17, 4096, 4097, 3 * 4096 + 5):
            ref = torch.randn(n, generator=g).to(dtype)
            yield f"{tag}_{n}_equal", ref, ref.clone()
            noise = (torch.randn(n, generator=g) * 1e-6).to(dtype)
            yield f"{tag}_{n}_close", ref, ref + noise
            far = ref.clone()
            far[n // 2] += 1.0
            yield f"{tag}_{n}_one_far", ref, far
        ref = torch.randn(5000, generator=g).to(dtype)
        ref[10] = 1e-7  # below tol: no relative difference there
        near = ref.clone()
        near[10] = 5e-5
        yield f"{tag}_tiny_reference", ref, near
        for what, value_ref, value_cand in (
            ("nan_both", math.nan, math.nan),
            ("nan_candidate", 1.0, math.nan),
            ("nan_reference", math.nan, 1.0),
            ("inf_both", math.inf, math.inf),
            ("inf_opposite", math.inf, -math.inf),
            ("inf_candidate", 2.0, math.inf),
            ("inf_reference", -math.inf, 0.0),
        ):
            r = ref.clone()
            c = ref.clone()
            r[4500], c[4500] = value_ref, value_cand
            yield f"{tag}_{what}", r, c
        wide = torch.randn(64, 130, generator=g).to(dtype)
        yield f"{tag}_2d_transposed", wide.t(), wide.t().contiguous() * 1.001


def run(device: str, dtypes: tuple[torch.dtype, ...]) -> list[dict]:
    from eval_server.checks import close_kernel, compare

    return [
        {
            "case": name,
            "torch": list(compare._torch_close(ref.to(device), cand.to(device), TOL)),
            "kernel": list(close_kernel.close_stats(ref.to(device), cand.to(device), TOL)),
        }
        for name, ref, cand in cases(dtypes)
    ]


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    dtypes = (
        (torch.float32, torch.float16) if device == "cpu" else (torch.float32, torch.float16, torch.bfloat16)
    )
    for row in run(device, dtypes):
        print(json.dumps(row))
