"""Workers sharing a GPU each get a fixed share of its memory (Hardening.gpu_memory_fraction):
the server derives it from --workers-per-device, Hardening checks it, and an out-of-memory error
under a share says so in the feedback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from eval_server import __main__ as server_main
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline.verdicts import error_info


@pytest.mark.parametrize(("workers", "share"), [(1, None), (2, 0.475), (4, 0.2375)])
def test_the_share_follows_workers_per_device(workers: int, share: float | None) -> None:
    args = server_main.build_parser().parse_args(["--workers-per-device", str(workers)])
    overrides = server_main.hardening_overrides(args)
    assert overrides.get("gpu_memory_fraction") == share
    assert Hardening(**overrides).gpu_memory_fraction == (share or 1.0)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_hardening_refuses_a_share_outside_0_1(bad: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        Hardening(gpu_memory_fraction=bad)


def _ctx(share: float) -> SimpleNamespace:
    return SimpleNamespace(hardening=Hardening(gpu_memory_fraction=share), workdir=Path.cwd())


def test_out_of_memory_under_a_share_names_it() -> None:
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB.")
    shared = error_info(exc, _ctx(0.475))
    assert "may allocate 48% of the GPU's memory" in shared["traceback"]
    assert shared["message"].endswith("Tried to allocate 6.00 GiB.")
    alone = error_info(exc, _ctx(1.0))
    assert "may allocate" not in alone["traceback"] + alone["message"]
    other = error_info(RuntimeError("boom"), _ctx(0.475))
    assert "may allocate" not in other["traceback"] + other["message"]
