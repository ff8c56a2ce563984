"""bench/eval_throughput.py --kernelbench: finding the problems in a checkout, and the stand-ins
kernelbench_eval.py registers for LLM clients that are not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import kernelbench_eval
from bench.eval_throughput import KERNELBENCH_CASES, kernelbench_jobs


def _checkout(root: Path, extra: tuple[str, ...] = ()) -> Path:
    for level, number, _ in KERNELBENCH_CASES:
        d = root / "KernelBench" / f"level{level}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{number}_Problem{number}.py").write_text("# problem\n")
        (d / f"{number}0_Other.py").write_text("# a different number with the same prefix digits\n")
    for rel in extra:
        (root / rel).write_text("# duplicate\n")
    return root


def test_kernelbench_jobs_finds_each_problem_by_level_and_number(tmp_path: Path) -> None:
    jobs = kernelbench_jobs(_checkout(tmp_path), [])
    assert [j.name for j in jobs] == [f"L{lv}_{n}_Problem{n}" for lv, n, _ in KERNELBENCH_CASES]
    for job, (_, _, cand) in zip(jobs, KERNELBENCH_CASES, strict=True):
        assert job.problem.is_file() and job.candidate.name == f"{cand}.py" and job.candidate.is_file()


def test_kernelbench_jobs_filters_by_name(tmp_path: Path) -> None:
    jobs = kernelbench_jobs(_checkout(tmp_path), ["L1_19_Problem19", "12_Problem12"])
    assert [j.name for j in jobs] == ["L1_19_Problem19", "L2_12_Problem12"]


def test_kernelbench_jobs_refuses_an_ambiguous_or_missing_problem(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="found 2"):
        kernelbench_jobs(_checkout(tmp_path, ("KernelBench/level1/19_Again.py",)), [])
    with pytest.raises(SystemExit, match="found 0"):
        kernelbench_jobs(tmp_path / "empty", [])


def test_stand_ins_only_for_missing_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = "no_such_llm_client_for_this_test"
    monkeypatch.setattr(kernelbench_eval, "LLM_CLIENT_MODULES", {missing: ("Client",), "json": ("dumps",)})
    monkeypatch.delitem(sys.modules, missing, raising=False)
    real_json = sys.modules["json"]
    try:
        assert kernelbench_eval.stand_in_missing_llm_clients() == [missing]
        assert sys.modules["json"] is real_json
        with pytest.raises(RuntimeError, match="never calls it"):
            sys.modules[missing].Client()
    finally:
        sys.modules.pop(missing, None)
