"""The KernelBench-sized benchmark corpus (bench.corpus): files, sizes, shrinking, and correctness.

Correctness runs every candidate against its problem shrunk to a toy size, in ONE subprocess with
TRITON_INTERPRET=1 (Triton kernels execute on the CPU). A subprocess keeps the interpreter switch
out of the pytest process: TRITON_INTERPRET is read when triton is imported, and other tests
(e.g. GPU tests collected in the same session) must get the real compiler. Extra runs override a
candidate's module-level tuning constants (smaller tiles) so that loops over several tiles, tail
masks, grouped tile ordering and the fallback kernels are exercised at these small sizes too.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench import corpus
from bench.corpus import BENCH_CASES
from eval_server.checks.static import run_static_checks

pytestmark = pytest.mark.unit

HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")

SUBPROCESS_TIMEOUT_S = 300
TOLERANCE = 1e-2  # the evaluator's default atol = rtol

BENCH_DIR = Path(corpus.__file__).resolve().parent
CASE_BY_PROBLEM = {case.problem: case for case in BENCH_CASES}

# Module-level constants of each problem at full size (sizes, plus the semantic values).
FULL_SIZE: dict[str, dict[str, Any]] = {
    "relu_large": {"BATCH": 4096, "DIM": 393216},
    "softmax_large": {"BATCH": 4096, "DIM": 65536},
    "sum_dim_large": {"BATCH": 128, "DIM1": 4096, "DIM2": 4096, "reduce_dim": 1},
    "gemm_scale_leakyrelu_large": {
        "BATCH": 1024,
        "IN_FEATURES": 8192,
        "OUT_FEATURES": 8192,
        "multiplier": 2.0,
        "negative_slope": 0.1,
    },
    "layernorm_large": {"BATCH": 4096, "FEATURES": 8192},
    "small_elementwise": {"BATCH": 2048, "DIM": 1024},
}


@dataclass(frozen=True)
class Run:
    """One interpreter run: a problem shrunk by `factor`, optionally edited, and its candidate."""

    id: str
    problem: str
    factor: int
    overrides: dict[str, Any] = field(default_factory=dict)  # candidate module attributes to set
    edits: tuple[tuple[str, str], ...] = ()  # (old line, new line) edits of the shrunk problem


RUNS: tuple[Run, ...] = (
    Run("relu_large", "relu_large", 300),  # (13, 1310): 5 blocks, masked tail
    Run("relu_large-small-blocks", "relu_large", 1000, {"BLOCK_SIZE": 64}),  # (4, 393)
    Run("softmax_large", "softmax_large", 512),  # (8, 128): one tile per row
    Run("softmax_large-looped", "softmax_large", 500, {"MAX_BLOCK_COLS": 32}),  # (8, 131): 5 tiles
    Run("sum_dim_large", "sum_dim_large", 60),  # (2, 68, 68)
    Run("sum_dim_large-tiles", "sum_dim_large", 60, {"BLOCK_R": 16, "BLOCK_INNER": 32}),
    Run(
        "sum_dim_large-dim0",
        "sum_dim_large",
        60,
        {"BLOCK_R": 16, "BLOCK_INNER": 32},
        (("reduce_dim = 1", "reduce_dim = 0"),),
    ),
    Run(
        "sum_dim_large-dim-1",
        "sum_dim_large",
        60,
        {"BLOCK_COLS": 16},
        (("reduce_dim = 1", "reduce_dim = -1"),),
    ),
    Run("gemm_scale_leakyrelu_large", "gemm_scale_leakyrelu_large", 150),  # (6, 54) -> 54
    Run(
        "gemm_scale_leakyrelu_large-grouped",  # (34, 273) -> 273: 3 x 18 tiles, GROUP_M 2, 18 k-steps
        "gemm_scale_leakyrelu_large",
        30,
        {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
    ),
    Run("layernorm_large", "layernorm_large", 100),  # (40, 81)
    Run("layernorm_large-looped", "layernorm_large", 100, {"MAX_FUSED_COLS": 16, "LOOP_BLOCK_COLS": 16}),
    Run("small_elementwise", "small_elementwise", 100),  # (20, 10)
)

# Run by `python -c` with argv = [jobs.json]. Each job names a problem file and a candidate file
# (real files: @triton.jit reads kernel source from them). For each job: Model and ModelNew are
# built after torch.manual_seed(0); their parameters must match, then both get the same random
# perturbation (so a candidate that ignored its weights would fail); both run on the same inputs.
# One JSON line per job. This harness (not a candidate) may catch errors to report them per job.
_COMPARE_SCRIPT = r"""
import importlib.util, json, sys, traceback
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

def run(job, index):
    problem = load(job["problem_path"], f"bench_problem_{index}")
    candidate = load(job["candidate_path"], f"bench_candidate_{index}")
    for attr, value in job["overrides"].items():
        assert hasattr(candidate, attr), f"candidate has no constant {attr}"
        setattr(candidate, attr, value)
    init_inputs = problem.get_init_inputs()
    torch.manual_seed(0)
    model = problem.Model(*init_inputs)
    torch.manual_seed(0)
    model_new = candidate.ModelNew(*init_inputs)
    ref_params = dict(model.named_parameters())
    new_params = dict(model_new.named_parameters())
    report = {"params": sorted(ref_params)}
    report["same_params"] = sorted(ref_params) == sorted(new_params) and all(
        torch.equal(ref_params[k], new_params[k]) for k in ref_params
    )
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in ref_params.items():
            p.add_(0.5 * torch.randn_like(p))
            if name in new_params:
                new_params[name].copy_(p)
    torch.manual_seed(1)
    inputs = problem.get_inputs()
    saved = [t.clone() for t in inputs]
    with torch.no_grad():
        ref = model(*inputs)
        out = model_new(*inputs)
    same_shape = tuple(ref.shape) == tuple(out.shape)
    report.update(
        input_shapes=[list(t.shape) for t in inputs],
        ref_shape=list(ref.shape),
        out_shape=list(out.shape),
        out_dtype=str(out.dtype),
        inputs_unchanged=all(torch.equal(a, b) for a, b in zip(inputs, saved)),
        max_abs_diff=(ref - out).abs().max().item() if same_shape and ref.numel() else None,
        allclose=same_shape and torch.allclose(ref, out, atol=1e-2, rtol=1e-2),
        allclose_1e_4=same_shape and torch.allclose(ref, out, atol=1e-4, rtol=1e-4),
    )
    return report

jobs = json.load(open(sys.argv[1]))
for index, job in enumerate(jobs):
    try:
        report = run(job, index)
    except Exception:
        report = {"error": traceback.format_exc()[-3000:]}
    report["id"] = job["id"]
    print(json.dumps(report), flush=True)
"""


def _edited_problem(run: Run) -> str:
    source = corpus.shrunk_problem(run.problem, run.factor)
    for old, new in run.edits:
        pattern = re.compile(rf"^{re.escape(old)}$", re.MULTILINE)
        assert len(pattern.findall(source)) == 1, f"{run.id}: line {old!r} not found exactly once"
        source = pattern.sub(new, source)
    return source


@pytest.fixture(scope="module")
def interpreter_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every run of RUNS in one TRITON_INTERPRET=1 subprocess; results keyed by run id."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed")
    workdir = tmp_path_factory.mktemp("bench_corpus")
    jobs = []
    for index, run in enumerate(RUNS):
        problem_path = workdir / f"problem_{index}.py"
        candidate_path = workdir / f"candidate_{index}.py"
        problem_path.write_text(_edited_problem(run), encoding="utf-8")
        candidate_path.write_text(
            corpus.load_candidate(CASE_BY_PROBLEM[run.problem].candidate), encoding="utf-8"
        )
        jobs.append(
            {
                "id": run.id,
                "problem_path": str(problem_path),
                "candidate_path": str(candidate_path),
                "overrides": run.overrides,
            }
        )
    jobs_path = workdir / "jobs.json"
    jobs_path.write_text(json.dumps(jobs), encoding="utf-8")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPARE_SCRIPT, str(jobs_path)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"harness failed:\n{proc.stderr[-4000:]}"
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            results[report["id"]] = report
    return results


def _module_constants(source: str, types: Any = int | float) -> dict[str, Any]:
    """Module-level `NAME = <constant of one of types>` assignments, parsed with ast."""
    out: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, types)
        ):
            out[node.targets[0].id] = node.value.value
    return out


def _is_size_name(name: str) -> bool:
    return name.isupper()


# --- corpus files and metadata ---


def test_cases_cover_every_file() -> None:
    problems = {p.stem for p in (BENCH_DIR / "problems").glob("*.py")}
    candidates = {p.stem for p in (BENCH_DIR / "candidates").glob("*__triton.py")}
    cuda = {p.stem.removesuffix("__cuda") for p in (BENCH_DIR / "candidates").glob("*__cuda.py")}
    others = {p.name for p in (BENCH_DIR / "candidates").glob("*.py")} - {
        f"{stem}.py" for stem in candidates | {f"{c}__cuda" for c in cuda}
    }
    assert {c.problem for c in BENCH_CASES} == problems
    assert {c.candidate for c in BENCH_CASES} == candidates
    assert cuda <= problems and not others, (
        cuda - problems,
        others,
    )  # __cuda: eval_throughput --backend cuda
    assert set(FULL_SIZE) == problems
    assert {run.problem for run in RUNS} == problems
    for case in BENCH_CASES:
        assert case.candidate == f"{case.problem}__triton"
        assert case.level in (1, 2)
        assert case.kernel_us_h200 > 0


@pytest.mark.parametrize("problem", sorted(FULL_SIZE))
def test_problem_has_full_size_constants(problem: str) -> None:
    source = corpus.load_problem(problem)
    constants = _module_constants(source)
    assert {k: constants.get(k) for k in FULL_SIZE[problem]} == FULL_SIZE[problem]
    # The regex that shrinks sizes sees exactly the ALL_CAPS integer constants ast sees.
    sizes = {k: v for k, v in constants.items() if _is_size_name(k) and isinstance(v, int)}
    assert corpus.size_constants(source) == sizes


@pytest.mark.parametrize("problem", sorted(FULL_SIZE))
def test_problem_is_kernelbench_format(problem: str) -> None:
    tree = ast.parse(corpus.load_problem(problem))
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert {"Model", "get_inputs", "get_init_inputs"} <= names
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            assert all(kw.arg != "device" for kw in node.keywords), "inputs must not name a device"


@pytest.mark.parametrize("case", BENCH_CASES, ids=lambda c: c.candidate)
def test_candidate_passes_static_checks(case: corpus.BenchCase) -> None:
    assert run_static_checks(ast.parse(corpus.load_candidate(case.candidate))) == []


def test_gemm_precision_is_a_module_constant() -> None:
    source = corpus.load_candidate("gemm_scale_leakyrelu_large__triton")
    assert (
        _module_constants(source, str)["DOT_PRECISION"] == "tf32x3"
    )  # fp32-accurate: the evaluator rejects plain tf32 for fp32 problems
    assert "input_precision=INPUT_PRECISION" in source


# --- shrunk_problem ---


@pytest.mark.parametrize("factor", [1, 7, 100, 10**9])
def test_shrunk_problem_divides_only_size_constants(factor: int) -> None:
    original = corpus.load_problem("gemm_scale_leakyrelu_large")
    shrunk = corpus.shrunk_problem("gemm_scale_leakyrelu_large", factor)
    assert corpus.size_constants(shrunk) == {
        k: max(1, v // factor) for k, v in corpus.size_constants(original).items()
    }
    changed = [(a, b) for a, b in zip(original.splitlines(), shrunk.splitlines(), strict=True) if a != b]
    assert all(re.fullmatch(r"[A-Z_]+ = \d+", b) for _, b in changed)
    assert _module_constants(shrunk)["multiplier"] == 2.0
    assert _module_constants(shrunk)["negative_slope"] == 0.1
    if factor == 1:
        assert shrunk == original


def test_shrunk_problem_keeps_semantic_constants() -> None:
    shrunk = corpus.shrunk_problem("sum_dim_large", 4096)
    assert _module_constants(shrunk) == {"BATCH": 1, "DIM1": 1, "DIM2": 1, "reduce_dim": 1}


@pytest.mark.parametrize("factor", [0, -3, 2.0, True])
def test_shrunk_problem_rejects_bad_factor(factor: Any) -> None:
    with pytest.raises(ValueError):
        corpus.shrunk_problem("relu_large", factor)


def test_sized_problem_sets_named_sizes_only() -> None:
    sized = corpus.sized_problem("sum_dim_large", {"BATCH": 16, "DIM2": 256})
    assert _module_constants(sized) == {"BATCH": 16, "DIM1": 4096, "DIM2": 256, "reduce_dim": 1}


@pytest.mark.parametrize("sizes", [{"WIDTH": 4}, {"reduce_dim": 2}, {"BATCH": 0}, {"BATCH": 2.0}])
def test_sized_problem_rejects_unknown_names_and_bad_sizes(sizes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        corpus.sized_problem("sum_dim_large", sizes)


@pytest.mark.parametrize("name", ["../corpus", "relu_large.py", "", "a/b"])
def test_loaders_reject_non_stems(name: str) -> None:
    with pytest.raises(ValueError):
        corpus.load_problem(name)
    with pytest.raises(ValueError):
        corpus.load_candidate(name)


# --- correctness in the Triton interpreter ---


@needs_triton
@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_candidate_matches_reference_in_interpreter(
    run: Run, interpreter_results: dict[str, dict[str, Any]]
) -> None:
    report = interpreter_results.get(run.id)
    assert report is not None, f"no result for {run.id}"
    assert "error" not in report, report.get("error")
    assert report["same_params"], f"ModelNew parameters differ from Model's: {report['params']}"
    assert report["out_shape"] == report["ref_shape"]
    assert report["out_dtype"] == "torch.float32"
    assert report["inputs_unchanged"]
    # Toy sizes only: a few thousand elements keep the interpreter fast.
    numel = sum(math.prod(shape) for shape in report["input_shapes"])
    assert 0 < numel <= 40_000, report["input_shapes"]
    assert report["allclose"], f"max abs diff {report['max_abs_diff']} > {TOLERANCE}"
