"""The precision check's skip rule (checks/precision.check_needed) and the check itself on CPU:
a candidate is only spared the float64 pass when that pass could not have rejected it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from eval_server.checks.compare import compare_outputs, normalized_error
from eval_server.checks.precision import check_needed as precision_check_needed
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline import loader
from eval_server.pipeline.context import EvalContext, Reference
from eval_server.pipeline.reference import precision_baseline
from eval_server.pipeline.verdicts import Stop
from eval_server.pipeline.verification import precision_check
from eval_server.schema import EvalResult

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(256, 128)

    def forward(self, x):
        return self.linear(x)

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
"""
HARD = Hardening()
FLOOR = HARD.precision_floor["float32"]


@pytest.mark.parametrize(
    "max_abs_diff, ref_scale, needed",
    [
        (0.0, 0.0, False),  # bit-identical output: nothing to measure
        (None, 1.0, True),
        (math.inf, 1.0, True),
        (1e-6, 0.0, True),  # no usable scale from the reference
        (4.9e-5, 1.0, False),
        (5.1e-5, 1.0, True),
        (1e-4, 10.0, False),
    ],
)
def test_skip_rule(max_abs_diff: float | None, ref_scale: float, needed: bool) -> None:
    assert precision_check_needed(max_abs_diff, ref_scale, FLOOR) is needed


def _reference(tmp_path: Path) -> tuple[Reference, torch.Tensor, torch.Tensor]:
    """The reference, one input and its expected output (held by the test, not the reference)."""
    cpu = torch.device("cpu")
    module = loader.import_source(PROBLEM, tmp_path, "reference")
    model = loader.build_model(module.Model, [], 0, cpu)
    with torch.no_grad():
        x = loader.make_inputs(module, 7, cpu)[0]
        out = model(x)
        prec = precision_baseline(module, model, 7, out, cpu, "fp32")
    assert prec is not None and prec.ref_scale > 0
    ref = Reference(module=module, model=model, init_inputs=[], seeds=[7], precision=prec, output_bytes=0)
    return ref, x, out


def _verdict(tmp_path: Path, ref: Reference, expected: torch.Tensor, cand: torch.Tensor) -> tuple[bool, bool]:
    """(whether the float64 pass was needed, whether the check rejected)."""
    ctx = EvalContext(torch.device("cpu"), "cpu", tmp_path, timing_enabled=False)
    result = EvalResult(status="ok")
    cmp = compare_outputs(expected, cand, "default")
    needed = precision_check_needed(cmp.max_abs_diff, ref.precision.ref_scale, FLOOR)
    try:
        precision_check(result, ctx, ref, cand, expected, cmp.max_abs_diff)
    except Stop:
        assert [c.id for c in result.checks] == ["runtime.low_precision"]
        return needed, True
    return needed, False


def test_honest_fp32_output_skips_the_float64_pass(tmp_path: Path) -> None:
    ref, x, out = _reference(tmp_path)
    w, b = ref.model.linear.weight, ref.model.linear.bias
    with torch.no_grad():
        other_order = (x.double() @ w.double().T + b.double()).float()  # a correctly rounded fp32 result
    assert _verdict(tmp_path, ref, out, other_order) == (False, False)


def test_bf16_output_is_checked_and_rejected(tmp_path: Path) -> None:
    ref, x, out = _reference(tmp_path)
    w, b = ref.model.linear.weight, ref.model.linear.bias
    with torch.no_grad():
        low = (x.bfloat16().float() @ w.bfloat16().float().T + b).float()
    assert _verdict(tmp_path, ref, out, low) == (True, True)


@pytest.mark.parametrize("scale", [1e-7, 1e-6, 1e-5, 3e-5, 1e-4, 1e-3])
def test_skipping_never_hides_a_rejection(tmp_path: Path, scale: float) -> None:
    ref, _, out = _reference(tmp_path)
    noisy = out + scale * float(out.abs().max()) * torch.randn_like(out).clamp(-1, 1)
    needed, rejected = _verdict(tmp_path, ref, out, noisy)
    err = normalized_error(noisy, out) - ref.precision.ref_error
    if not needed:
        assert err <= FLOOR and not rejected
    else:
        assert rejected == (err > max(FLOOR, HARD.precision_factor * ref.precision.budget))
