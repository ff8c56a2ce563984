"""The runner's compiled reference (options.baseline_compile), on CPU: torch.compile's outputs
equal the eager reference's, the compile happens when the runner loads it (not in a timing), and
Inductor's and Triton's caches go to the evaluation's own directory, the worker's settings
restored for the candidate."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

from eval_server.runner.serve import Runner

pytestmark = pytest.mark.integration

PROBLEM = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0 + 1.0
def get_inputs():
    return [torch.randn(64, 32)]
def get_init_inputs():
    return []
"""


def test_compiled_reference_matches_and_keeps_its_caches_in_the_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_triton = str(tmp_path / "worker-triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", worker_triton)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    a, b = socket.socketpair()
    try:
        compiled = Runner(a, torch.device("cpu"), str(tmp_path / "compiled"))
        (tmp_path / "compiled").mkdir()
        compiled.load_reference(PROBLEM, 42, compiled=True)
        inductor = tmp_path / "compiled" / "compiled_reference" / "inductor"
        assert inductor.is_dir() and any(inductor.rglob("*")), "Inductor wrote nothing in the evaluation"
        assert os.environ["TRITON_CACHE_DIR"] == worker_triton
        assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
        eager = Runner(b, torch.device("cpu"), str(tmp_path / "eager"))
        (tmp_path / "eager").mkdir()
        eager.load_reference(PROBLEM, 42)
        x = torch.randn(64, 32)
        with torch.no_grad():
            torch.testing.assert_close(compiled.model(x), eager.model(x))
    finally:
        a.close()
        b.close()
