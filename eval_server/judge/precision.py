"""The judge's precision facts of a problem and the precision rule on the calls it compares.

The candidate's process checks its first correctness trial against float64 (runtime.low_precision),
but a candidate can tell its first calls from later ones (it counts them) and compute in tf32 or
bf16 only after: every later output is within the default tolerance (1e-2) of the fp32 reference,
and the speedup is real. So the judge measures the same facts itself, before any candidate code
exists in its runner (pipeline/reference.precision_baseline on the problem's seed; once per
problem and worker, kept with the reference's timing: known.py), and holds every call it compares,
its own correctness calls and the kept timed calls alike, to the rule of checks/precision.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from eval_server.checks import precision as rule
from eval_server.checks.compare import Comparison, compare_outputs
from eval_server.pipeline.context import Precision
from eval_server.pipeline.reference import precision_baseline


@dataclasses.dataclass(frozen=True)
class Rule:
    """The facts and the policy a compared call is held to."""

    facts: Precision
    hardening: Any  # isolation.hardening.Hardening: floor, factors, policy

    def apply(self, out: Any, expected: Any, comparison: Comparison) -> Comparison:
        """`comparison` (of `out` with the fp32 `expected`), failed when `out` is further from
        float64 than the policy allows."""
        if not comparison.passed:
            return comparison
        over = rule.excess(out, expected, comparison.max_abs_diff, self.facts, self.hardening)
        if over is None:
            return comparison
        message = rule.message(*over, self.facts.dtype, self.hardening.precision_policy)
        return dataclasses.replace(comparison, passed=False, detail=message)


def measure(
    module: Any, model: torch.nn.Module, seed: int, out32: Any, device: torch.device, policy: str
) -> dict[str, Any]:
    """The facts as JSON ({} when the problem has none: no floating output, or an op without a
    float64 kernel); `out32`: the reference's output on the inputs of `seed`."""
    facts = precision_baseline(module, model, seed, out32, device, policy)
    return {} if facts is None else dataclasses.asdict(facts)


def rule_for(facts: dict[str, Any] | None, hardening: Any) -> Rule | None:
    return Rule(Precision(**facts), hardening) if facts else None


def compare_call(expected: Any, got: Any, tolerance: str, held_to: Rule | None) -> Comparison:
    """A call the judge compares: the tolerance, then (facts known) the precision rule."""
    comparison = compare_outputs(expected, got, tolerance)
    return comparison if held_to is None else held_to.apply(got, expected, comparison)
