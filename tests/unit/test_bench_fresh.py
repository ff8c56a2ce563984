"""bench/fresh.py: never-seen candidates (unique Triton kernels) and the RL-like mix."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.fresh import break_first_kernel, fresh_requests, fresh_source, jit_functions
from eval_server import samples

pytestmark = pytest.mark.unit


def test_every_kernel_gets_a_unique_name_and_the_file_stays_python() -> None:
    source = samples.load_candidate("relu__correct")
    a, b = fresh_source(source, "x1"), fresh_source(source, "x2")
    assert jit_functions(a) == ["relu_kernel_x1"] and jit_functions(b) == ["relu_kernel_x2"]
    assert "relu_kernel[" not in a and "relu_kernel_x1[" in a  # the launch follows the rename
    ast.parse(a)


def test_a_broken_kernel_refers_to_a_name_that_does_not_exist() -> None:
    broken = break_first_kernel(samples.load_candidate("relu__correct"))
    ast.parse(broken)
    assert "tl.undefined_name_of_a_fresh_candidate" in broken
    with pytest.raises(ValueError):
        break_first_kernel("x = 1\n")


def test_the_mixes_cycle_and_never_repeat_a_candidate(tmp_path: Path) -> None:
    mix = fresh_requests(None, 30, "t")
    assert len({r.candidate_source for r in mix}) == 30
    assert {r.expected_status for r in mix} >= {"ok", "incorrect", "compile_error", "timeout", "rejected"}
    problem, candidate = tmp_path / "p.py", tmp_path / "c.py"
    problem.write_text(samples.load_problem("relu"))
    candidate.write_text(samples.load_candidate("relu__correct"))
    jobs = fresh_requests([("relu", problem, candidate)], 6, "k")
    assert [r.expected_status for r in jobs] == ["ok", "ok", "compile_error"] * 2
    assert len({r.candidate_source for r in jobs}) == 6
