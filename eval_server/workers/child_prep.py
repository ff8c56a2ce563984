"""The trusted preparation of an evaluation child before its request arrives (worker.py: the
spare): the CUDA context, Triton's first launch, the profiler's first start and the output
comparison's kernels, which would otherwise cost the evaluation itself ~0.8 s."""

from __future__ import annotations

import torch


def create_context(device: torch.device) -> None:
    """The CUDA context, by one allocation: no kernel runs."""
    torch.empty(1, device=device)


def launch_first_kernels(device: torch.device) -> None:
    """The first launches whose one-time costs (Triton's launcher and driver helpers, CUPTI's
    start, the comparison kernel's load) would otherwise fall into the evaluation."""
    from eval_server.checks.compare import compare_outputs
    from eval_server.checks.runtime import profile_device_activity
    from eval_server.workers import triton_warmup

    triton_warmup.warm_up(device)
    profile_device_activity(lambda: None, device)
    x = torch.ones(4096, device=device)  # loads the comparison's kernels (close_kernel)
    compare_outputs(x, x.clone(), "default")


def prepare(device: torch.device) -> None:
    """The context, then the first kernels."""
    create_context(device)
    launch_first_kernels(device)
