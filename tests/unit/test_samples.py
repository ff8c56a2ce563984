"""The bundled sample corpus (eval_server.samples): files, problems, and the correct candidates.

Candidates are run in a subprocess each with TRITON_INTERPRET=1, so the Triton kernels execute on
the CPU. A subprocess keeps this independent of whether (and how) triton was already imported in
the pytest process: TRITON_INTERPRET is read when triton is imported, and this file must not
switch it on for other tests, e.g. GPU tests collected in the same session.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval_server import samples
from eval_server.schema import STATUS_INCORRECT, STATUS_OK, STATUSES

HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")

SUBPROCESS_TIMEOUT_S = 180

# Run by `python -c` with argv = [problem_path, candidate_path]. Imports both files as real modules
# (@triton.jit reads the kernel's source from its file), builds Model and ModelNew from the same
# seed, feeds both the same inputs and prints one JSON line comparing the outputs.
_COMPARE_SCRIPT = r"""
import importlib.util, json, sys
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

problem = load(sys.argv[1], "sample_problem")
candidate = load(sys.argv[2], "sample_candidate")
init_inputs = problem.get_init_inputs()
torch.manual_seed(0)
model = problem.Model(*init_inputs)
torch.manual_seed(0)
model_new = candidate.ModelNew(*init_inputs)
torch.manual_seed(1)
inputs = problem.get_inputs()
with torch.no_grad():
    ref = model(*inputs)
    out = model_new(*inputs)
same_shape = tuple(ref.shape) == tuple(out.shape)
report = {
    "ref_shape": list(ref.shape),
    "out_shape": list(out.shape),
    "out_dtype": str(out.dtype),
    "max_abs_diff": (ref - out).abs().max().item() if same_shape else None,
    "allclose": same_shape and torch.allclose(ref, out, atol=1e-2, rtol=1e-2),
}
for tol in (0.0, 1e-6, 1e-5, 1e-4):
    report[f"allclose_{tol:g}"] = same_shape and torch.allclose(ref, out, atol=tol, rtol=tol)
print(json.dumps(report))
"""

# Tolerance each correct candidate must meet on top of the evaluator's default 1e-2.
TIGHT_TOLERANCE = {
    "relu": 0.0,  # max(x, 0) is exact
    "softmax": 1e-6,
    "sum_dim": 1e-5,  # 64-term fp32 sums in a different order
    "matmul": 1e-4,  # ieee tl.dot: passes the "strict" fp32 profile too
    "gemm_scale_leakyrelu": 1e-4,
}

CORRECT_CASES = [case for case in samples.SAMPLE_CASES if case.expected_status == STATUS_OK]
INCORRECT_CASES = [case for case in samples.SAMPLE_CASES if case.expected_status == STATUS_INCORRECT]


def _compare(case: samples.SampleCase, tmp_path: Path) -> dict:
    problem_path = tmp_path / f"{case.problem}.py"
    candidate_path = tmp_path / f"{case.candidate}.py"
    problem_path.write_text(samples.load_problem(case.problem), encoding="utf-8")
    candidate_path.write_text(samples.load_candidate(case.candidate), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", _COMPARE_SCRIPT, str(problem_path), str(candidate_path)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{case.candidate} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _exec_problem(name: str) -> dict:
    namespace: dict = {"__name__": f"sample_problem_{name}"}
    exec(compile(samples.load_problem(name), f"<problem {name}>", "exec"), namespace)
    return namespace


# -- (a) the case table and the files agree ------------------------------------------------------


@pytest.mark.unit
def test_cases_refer_to_existing_files_and_cover_every_candidate_once():
    problems = set(samples.problem_names())
    candidates = samples.candidate_names()
    for case in samples.SAMPLE_CASES:
        assert case.problem in problems, case
        assert case.candidate in candidates, case
        assert case.candidate.startswith(f"{case.problem}__"), case
        assert case.expected_status in STATUSES, case
        assert case.what.strip() and "\n" not in case.what, case
    cuda = list(samples.CUDA_SAMPLE_CASES)
    for case in cuda:
        assert case.backend == "cuda" and case.candidate.startswith(f"{case.problem}__cuda_"), case
        assert case.problem in problems and case.expected_status in STATUSES, case
    assert all(case.backend == "triton" for case in samples.SAMPLE_CASES)
    used = [case.candidate for case in (*samples.SAMPLE_CASES, *cuda)]
    assert sorted(used) == candidates  # each file exactly once, no case without a file
    assert {case.problem for case in samples.SAMPLE_CASES} == problems


@pytest.mark.unit
def test_cases_list_problems_in_corpus_order_with_one_correct_candidate_each():
    order = list(dict.fromkeys(case.problem for case in samples.SAMPLE_CASES))
    assert order == ["relu", "softmax", "sum_dim", "matmul", "gemm_scale_leakyrelu"]
    assert sorted(case.problem for case in CORRECT_CASES) == sorted(order)
    assert all(case.candidate == f"{case.problem}__correct" for case in CORRECT_CASES)


@pytest.mark.unit
def test_unknown_names_raise_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="unknown sample problem 'nope'.*relu"):
        samples.load_problem("nope")
    with pytest.raises(KeyError, match="unknown sample candidate 'relu'.*relu__correct"):
        samples.load_candidate("relu")
    with pytest.raises(KeyError):
        samples.load_problem("../candidates/relu__correct")


@pytest.mark.unit
def test_candidate_sources_have_the_shape_their_case_claims():
    for name in samples.candidate_names():
        source = samples.load_candidate(name)
        if name.endswith("__syntax_error"):
            with pytest.raises(SyntaxError):
                ast.parse(source)
            continue
        tree = ast.parse(source)
        assert ast.get_docstring(tree), f"{name} has no module docstring"
        classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        assert ("ModelNew" in classes) == (not name.endswith("__no_modelnew")), name


# -- (b) every problem runs on the CPU -----------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("name", samples.problem_names())
def test_problem_runs_on_cpu(name: str):
    source = samples.load_problem(name)
    assert "cuda" not in source and "device" not in source  # the evaluator picks the device
    namespace = _exec_problem(name)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in inputs)
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


# -- (c) the correct candidates match their problems (Triton interpreter, one subprocess each) ----


@pytest.mark.unit
@needs_triton
@pytest.mark.parametrize("case", CORRECT_CASES, ids=lambda case: case.candidate)
def test_correct_candidate_matches_reference(case: samples.SampleCase, tmp_path: Path):
    report = _compare(case, tmp_path)
    assert report["out_shape"] == report["ref_shape"], report
    assert report["out_dtype"] == "torch.float32", report
    assert report["allclose"], report
    tight = TIGHT_TOLERANCE[case.problem]
    assert report[f"allclose_{tight:g}"], f"{case.candidate} is not within {tight:g}: {report}"


@pytest.mark.unit
@needs_triton
@pytest.mark.parametrize("case", INCORRECT_CASES, ids=lambda case: case.candidate)
def test_incorrect_candidate_runs_but_differs(case: samples.SampleCase, tmp_path: Path):
    report = _compare(case, tmp_path)
    assert not report["allclose"], report
