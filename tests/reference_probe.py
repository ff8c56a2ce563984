"""Evaluate one honest candidate in this process, looking for a live reference output every time
candidate code is about to run (its import and every call: correctness, timing, refill checks).

evaluate.py promises that no reference output exists while candidate code runs. A forward hook
on the reference model records every output it produces (a weak reference to the tensor and to
its storage, so a view or alias that outlives the tensor counts too) and, on CPU, a fingerprint
of its bytes; before candidate code runs, each must be gone and no live tensor in the process
(gc.get_objects) may hold the same bytes. The candidate scales ReLU by (1 + 2^-20): within
every tolerance, yet never bit-equal to the reference, so its own outputs are not mistaken for
reference outputs. `--leak` keeps the reference outputs alive: the probe must then find them.

Run in a fresh process (Triton's interpreter must be chosen before triton is imported):
`TRITON_INTERPRET=1 python -m tests.reference_probe --device cpu`; prints one JSON line.
Used by tests/integration/test_reference_unreachable.py and tests/gpu/test_reference_unreachable_gpu.py.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes

from eval_server import samples
from eval_server.checks.compare import flatten_output
from eval_server.pipeline import evaluate, loader
from eval_server.pipeline.context import LAUNCHES, THREADS, EvalContext
from eval_server.schema import EvalOptions, EvalRequest

CANDIDATE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0) * 1.00000095367431640625, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK_SIZE=4096)
        return out
"""


def _fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    data = t.detach().contiguous().view(-1).view(torch.uint8)
    return (tuple(t.shape), str(t.dtype), hashlib.sha256(bytes(data.tolist())).hexdigest())


class Probe:
    def __init__(self, scan_values: bool, leak: bool) -> None:
        self.scan_values, self.leak = scan_values, leak
        self.outputs: list[tuple[weakref.ref, StorageWeakRef]] = []
        self.fingerprints: set[tuple[Any, ...]] = set()
        self.kept: list[Any] = []
        self.looks = 0
        self.found: list[str] = []

    def record(self, module: Any, inputs: Any, output: Any) -> None:
        """Forward hook of the reference model (and of its float64 copy)."""
        with _disable_current_modes():
            for _, leaf in flatten_output(output):
                if isinstance(leaf, torch.Tensor):
                    self.outputs.append((weakref.ref(leaf), StorageWeakRef(leaf.untyped_storage())))
                    if self.scan_values:
                        self.fingerprints.add(_fingerprint(leaf))
            if self.leak:
                self.kept.append(output)

    def look(self, when: str) -> None:
        self.looks += 1
        for i, (tensor, storage) in enumerate(self.outputs):
            if tensor() is not None or not storage.expired():
                self.found.append(f"{when}: reference output {i} is alive")
        if self.scan_values:
            with _disable_current_modes():
                shapes = {fp[0] for fp in self.fingerprints}
                for obj in gc.get_objects():
                    if (
                        type(obj) is torch.Tensor
                        and tuple(obj.shape) in shapes
                        and _fingerprint(obj) in self.fingerprints
                    ):
                        self.found.append(f"{when}: a live tensor holds a reference output's bytes")


def run(device: str, leak: bool) -> dict[str, Any]:
    probe = Probe(scan_values=device == "cpu", leak=leak)
    build_model, load_candidate = loader.build_model, evaluate.load_candidate

    def build(cls: type, *args: Any, **kwargs: Any) -> Any:
        model = build_model(cls, *args, **kwargs)
        if cls.__name__ == "Model":
            # a function, not the bound method: deepcopy (the float64 copy of the precision
            # baseline) keeps functions as they are, so the copy's outputs are recorded here too
            model.register_forward_hook(lambda m, i, o: probe.record(m, i, o))
        return model

    def load(*args: Any, **kwargs: Any) -> Any:
        probe.look("candidate import")
        model = load_candidate(*args, **kwargs)

        def call(*inputs: Any) -> Any:
            probe.look("candidate call")
            return model(*inputs)

        return call

    loader.build_model, evaluate.load_candidate = build, load
    LAUNCHES.install()
    THREADS.install()
    on_gpu = device == "cuda"
    ctx = EvalContext(
        device=torch.device("cuda", 0) if on_gpu else torch.device("cpu"),
        device_label=device,
        workdir=Path(tempfile.mkdtemp(prefix="reference-probe-")),
        timing_enabled=on_gpu,
    )
    options = EvalOptions(correctness_trials=5, timing_trials=20, warmup_trials=2)
    request = EvalRequest(reference=samples.load_problem("relu"), candidate=CANDIDATE, options=options)
    result = evaluate.evaluate(request, ctx)
    return {
        "status": result.status,
        "feedback": result.feedback,
        "recorded": len(probe.outputs),
        "looks": probe.looks,
        "found": probe.found[:20],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--leak", action="store_true", help="keep reference outputs alive (control)")
    args = parser.parse_args()
    print(json.dumps(run(args.device, args.leak)))


if __name__ == "__main__":
    main()
