"""A trivial Triton kernel that the worker's spare child launches before its request arrives
(GPU), or the worker itself once at start-up (CPU, TRITON_INTERPRET=1).

The first Triton launch in a process loads Triton's driver helpers and builds its launcher:
~0.45 s on the H200 host, measured in a forked child with a warm Triton cache, against ~2 ms
for a candidate's first launch once another kernel has run (worker.py, `_child_prepare`). On the
CPU the interpreter's first launch imports ~50 modules (Triton's code generator, its gluon
package): done once in the worker before it forks, each child finds them loaded (the median
in-worker time of the bundled relu sample fell from 158 to 90 ms on a 2-core VM, 2026-11-27).
A CUDA context must not exist in the worker (it forks), so on a GPU the spare child does it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def warm_up(device: torch.device) -> None:
    """Launch the kernel once on `device` and check that it ran."""
    x = torch.zeros(16, device=device)
    _add_one[(1,)](x, 16, BLOCK=16)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not bool((x == 1).all()):
        raise RuntimeError("the Triton warm-up kernel did not run")
