"""bench/eval_throughput.py --kernelbench: finding the problems in a checkout, the candidates of
each backend (`--backend cuda`: the `__cuda` files, which pass the CUDA static rules), and the
stand-ins kernelbench_eval.py registers for LLM clients that are not installed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from bench import kernelbench_eval
from bench.eval_throughput import (
    BACKENDS,
    KERNELBENCH_CASES,
    bench_jobs,
    candidate_path,
    gpu_exclusive_s,
    gpu_shared_s,
    kernelbench_jobs,
    parse_args,
)
from eval_server.checks.cuda_static import CUDA_RULES, kernel_names
from eval_server.checks.static import run_static_checks


def _checkout(root: Path, extra: tuple[str, ...] = ()) -> Path:
    for level, number, _ in KERNELBENCH_CASES:
        d = root / "KernelBench" / f"level{level}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{number}_Problem{number}.py").write_text("# problem\n")
        (d / f"{number}0_Other.py").write_text("# a different number with the same prefix digits\n")
    for rel in extra:
        (root / rel).write_text("# duplicate\n")
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernelbench_jobs_finds_each_problem_by_level_and_number(tmp_path: Path, backend: str) -> None:
    jobs = kernelbench_jobs(_checkout(tmp_path), [], backend)
    assert [j.name for j in jobs] == [f"L{lv}_{n}_Problem{n}" for lv, n, _ in KERNELBENCH_CASES]
    for job, (_, _, problem) in zip(jobs, KERNELBENCH_CASES, strict=True):
        assert job.problem.is_file() and job.candidate.is_file()
        assert job.candidate.name == f"{problem}__{backend}.py"


@pytest.mark.parametrize("problem", [p for _, _, p in KERNELBENCH_CASES])
def test_cuda_candidates_pass_the_cuda_static_rules(problem: str) -> None:
    source = candidate_path(problem, "cuda").read_text(encoding="utf-8")
    assert run_static_checks(ast.parse(source), CUDA_RULES) == []
    assert kernel_names(source), "no __global__ kernel in the candidate's sources"


def test_bench_jobs_of_the_cuda_backend_and_a_problem_without_a_cuda_candidate() -> None:
    names = [p for _, _, p in KERNELBENCH_CASES]
    jobs = bench_jobs(names, "cuda")
    assert [j.name for j in jobs] == names
    assert all(j.candidate.name.endswith("__cuda.py") for j in jobs)
    assert [j.candidate.stem for j in bench_jobs(names)] == [f"{n}__triton" for n in names]
    with pytest.raises(SystemExit, match="no cuda candidate for layernorm_large"):
        bench_jobs(["layernorm_large"], "cuda")


def test_cli_backend_defaults_to_triton_and_takes_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([]).backend == "triton"
    args = parse_args(["--kernelbench", "kb", "--backend", "cuda", "--repeats", "2"])
    assert (args.backend, args.kernelbench, args.repeats) == ("cuda", Path("kb"), 2)
    with pytest.raises(SystemExit):
        parse_args(["--backend", "rocm"])
    assert "invalid choice: 'rocm'" in capsys.readouterr().err


def test_kernelbench_jobs_filters_by_name(tmp_path: Path) -> None:
    jobs = kernelbench_jobs(_checkout(tmp_path), ["L1_19_Problem19", "12_Problem12"])
    assert [j.name for j in jobs] == ["L1_19_Problem19", "L2_12_Problem12"]
    by_ours = kernelbench_jobs(_checkout(tmp_path), ["relu_large", "gemm_scale_leakyrelu_large"])
    assert [j.name for j in by_ours] == ["L1_19_Problem19", "L2_12_Problem12"]


def test_a_case_name_that_matches_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown relu_larg;"):
        kernelbench_jobs(_checkout(tmp_path), ["relu_larg"])
    with pytest.raises(SystemExit, match="unknown nope;"):
        bench_jobs(["nope"])


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


def test_server_args_give_one_configuration_each() -> None:
    assert parse_args([]).server_args == [""]
    args = parse_args(["--server-args", "", "--server-args", "--timing-ci 0.002"])
    assert args.server_args == ["", "--timing-ci 0.002"]


def test_the_exclusive_seconds_count_the_hand_over_once() -> None:
    """Inside the reference's timing when the judge timed the reference; alone when the worker knew it."""
    timed = {"judge_reference_timing": 0.7, "judge_handover": 0.02, "judge_timing": 0.5, "judge_bind": 0.1}
    known = {"judge_handover": 0.02, "judge_timing": 0.5, "judge_bind": 0.1}
    assert gpu_exclusive_s(timed) == pytest.approx(1.2)
    assert gpu_exclusive_s(known) == pytest.approx(0.52)
    assert gpu_exclusive_s({"judge_first_layer": 0.3}) == 0.0


def test_the_lock_hold_phases_win_over_the_phase_sums_when_the_evaluator_reports_them() -> None:
    """Hold time only: the exclusive phases also hold their wait for the lock."""
    phases = {"judge_handover": 0.9, "judge_timing": 0.5, "judge_gpu_held_exclusive": 0.45}
    assert gpu_exclusive_s(phases) == pytest.approx(0.45)
    assert gpu_shared_s({"judge_gpu_held_shared": 0.2, "gpu_held_shared": 0.3}) == pytest.approx(0.5)
    assert gpu_shared_s({}) == 0.0
