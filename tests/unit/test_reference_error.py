"""A reference whose own code fails ends the evaluation as `reference_error`, with its error, before
any candidate code runs: at import, and in the first forward (the reference's facts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eval_server import samples
from eval_server.pipeline import evaluate
from eval_server.pipeline.context import EvalContext
from eval_server.schema import EvalRequest

FAILING_FORWARD = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        raise ValueError("the reference itself is broken")

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    "reference, error_type",
    [(FAILING_FORWARD, "ValueError"), ("import no_such_module_for_sure\n", "ModuleNotFoundError")],
)
def test_reference_failure_is_reference_error(tmp_path: Path, reference: str, error_type: str) -> None:
    ctx = EvalContext(device=torch.device("cpu"), device_label="cpu", workdir=tmp_path, timing_enabled=False)
    result = evaluate.evaluate(
        EvalRequest(reference=reference, candidate=samples.load_candidate("relu__correct")), ctx
    )
    assert result.status == "reference_error" and not result.correct
    assert result.error is not None and result.error["type"] == error_type
    assert "load_candidate" not in result.phases
