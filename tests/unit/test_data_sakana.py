"""slime_ext.data.sakana: AI CUDA Engineer Archive rows -> KernelBench-CUDA SFT pairs."""

from __future__ import annotations

import ast
import asyncio
import json
import math
import types

import httpx
import pytest
import torch

from bench.synthetic_data import (
    LINEAR_SCALE_FUNCTIONAL,
    LINEAR_SCALE_MODULE,
    RELU_CUDA,
    RELU_FUNCTIONAL,
    sakana_row,
    sakana_rows,
)
from eval_server.schema import EvalOptions, EvalResult
from krl_common.validation import ValidationError
from slime_ext.clients.eval_client import EvalClient
from slime_ext.data.kernelbook import Rejected, canonical_hash
from slime_ext.data.report import FilterReport
from slime_ext.data.sakana import (
    EXTENSION,
    archive_pair,
    cuda_answer_rejection,
    parse_archive_row,
    select_archive_pairs,
    to_cuda_answer,
)
from slime_ext.data.sft_build import SFTBuildConfig, single_turn_example
from slime_ext.data.sft_verify import verify_pairs
from slime_ext.rollout.prompts import default_prompt

pytestmark = pytest.mark.unit

OPTIONS = EvalOptions(correctness_trials=1, timing=False)


def _namespace(source: str, load_inline=None) -> dict:
    """Execute a module source; `load_inline` stands in for torch's (no CUDA on this machine)."""
    ns: dict = {}
    if load_inline is not None:
        cpp = types.ModuleType("torch.utils.cpp_extension")
        cpp.load_inline = load_inline  # type: ignore[attr-defined]
        ns["__builtins__"] = dict(__builtins__ if isinstance(__builtins__, dict) else vars(__builtins__))
        real_import = ns["__builtins__"]["__import__"]

        def _import(name, *args, **kwargs):
            return cpp if name == "torch.utils.cpp_extension" else real_import(name, *args, **kwargs)

        ns["__builtins__"]["__import__"] = _import
    exec(compile(source, "<module>", "exec"), ns)
    return ns


def test_answer_is_a_load_inline_model_new_that_calls_the_extension() -> None:
    answer = to_cuda_answer(LINEAR_SCALE_FUNCTIONAL, "__global__ void k() {}\n", "cuda_x")
    tree = ast.parse(answer)
    assert {n.name for n in tree.body if isinstance(n, ast.ClassDef)} == {"ModelNew"}
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "module_fn" for n in tree.body)
    forward = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert [a.arg for a in forward.args.args] == ["self", "x"] and not forward.args.defaults
    assert f"return {EXTENSION}.forward(x, self.weight, self.bias, self.scale)" in answer
    assert 'load_inline(name="cuda_x", cpp_sources="", cuda_sources=cuda_source' in answer
    assert 'cuda_source = r"""\n__global__ void k() {}\n"""' in answer
    assert "super(ModelNew, self)" in answer and answer.index("load_inline\n") < answer.index("cuda_source")


def test_answer_builds_the_same_parameters_and_passes_them_in_order() -> None:
    """With load_inline replaced by an extension whose forward is the archive's PyTorch
    `module_fn`, ModelNew must compute what the reference Model computes (same seed): the rewrite
    keeps the parameters and the call's arguments; only the CUDA itself needs a GPU (tests/gpu)."""
    functional = _namespace(LINEAR_SCALE_FUNCTIONAL)
    built: list[dict] = []

    def fake_load_inline(**kwargs):
        built.append(kwargs)
        return types.SimpleNamespace(forward=functional["module_fn"])

    answer = _namespace(to_cuda_answer(LINEAR_SCALE_FUNCTIONAL, "// cuda", "cuda_t"), fake_load_inline)
    reference = _namespace(LINEAR_SCALE_MODULE)
    assert built[0]["name"] == "cuda_t" and built[0]["cuda_sources"] == "\n// cuda\n"
    init = reference["get_init_inputs"]()
    torch.manual_seed(3)
    ref_model = reference["Model"](*init)
    torch.manual_seed(3)
    new_model = answer["ModelNew"](*init)
    x = reference["get_inputs"]()[0]
    torch.testing.assert_close(new_model(x), ref_model(x))


@pytest.mark.parametrize(
    ("functional", "reason"),
    [
        (RELU_FUNCTIONAL.replace("fn=module_fn", "fn=None"), "functional_unsupported"),
        (RELU_FUNCTIONAL.replace("return fn(x)", "return fn(x) if fn else x"), "functional_unsupported"),
        (RELU_FUNCTIONAL + "\nHELPER = module_fn\n", "functional_unsupported"),
        (RELU_FUNCTIONAL.replace("class Model", "class Net"), "functional_unsupported"),
        ("def broken(:\n", "functional_syntax"),
    ],
)
def test_functional_forms_that_cannot_be_rewritten(functional: str, reason: str) -> None:
    with pytest.raises(Rejected) as exc:
        to_cuda_answer(functional, RELU_CUDA, "n")
    assert exc.value.reason == reason


def test_cuda_source_checks() -> None:
    assert cuda_answer_rejection(RELU_CUDA) is None
    assert cuda_answer_rejection("// __global__ <<<\n").reason == "answer_no_kernel"  # type: ignore[union-attr]
    no_bind = RELU_CUDA[: RELU_CUDA.index("PYBIND11_MODULE")]
    assert cuda_answer_rejection(no_bind).reason == "answer_no_binding"  # type: ignore[union-attr]
    aten = RELU_CUDA.replace("return y;", "return at::matmul(y, torch::conv2d(y, y));")
    rejected = cuda_answer_rejection(aten)
    assert rejected is not None and rejected.reason == "answer_torch_ops"
    assert rejected.detail == "static.cuda_torch_compute: at::matmul(), torch::conv2d()"
    assert cuda_answer_rejection(aten, allow_torch_ops=True) is None
    # the evaluator's other source rules apply too (here: a stream of its own)
    stream = RELU_CUDA.replace("return y;", "cudaStream_t s; cudaStreamCreate(&s); return y;")
    rejected = cuda_answer_rejection(stream)
    assert rejected is not None and rejected.reason == "answer_evaluator_rule"
    assert rejected.detail.startswith("static.cuda_process_escape: cudaStreamCreate")
    with pytest.raises(Rejected, match="answer_unquotable"):
        to_cuda_answer(RELU_FUNCTIONAL, RELU_CUDA + '// """\n', "n")


def test_row_fields_and_missing_columns() -> None:
    key, meta = parse_archive_row(sakana_row(2, 7, "m", "f", "c", CUDA_Speedup_Native=float("nan")), 0)
    assert key.startswith("L2_T7_") and meta["level"] == 2 and meta["task_id"] == 7
    assert "CUDA_Speedup_Native" not in meta and json.dumps(meta, allow_nan=False)  # strict JSON
    with pytest.raises(ValidationError, match=r"missing column\(s\) \['CUDA_Code'\]"):
        parse_archive_row({k: v for k, v in sakana_row(1, 1, "m", "f", "c").items() if k != "CUDA_Code"}, 3)
    with pytest.raises(Rejected, match="invalid_row"):
        parse_archive_row(sakana_row(1, 1, "m", "f", "  "), 0)


def test_selection_ranks_dedups_excludes_and_counts() -> None:
    report = FilterReport()
    pairs = select_archive_pairs(sakana_rows(), SFTBuildConfig(), report, per_task=1)
    assert [p.metadata["task_id"] for p in pairs] == [19, 7]
    assert pairs[0].metadata["CUDA_Speedup_Native"] == 1.4  # the faster of the two ReLU kernels
    assert report.rows == 7 and dict(report.dropped) == {
        "duplicate": 1,
        "not_correct": 1,
        "answer_torch_ops": 1,
        "answer_no_kernel": 1,
        "per_task_limit": 1,
    }
    report = FilterReport()
    config = SFTBuildConfig(exclude_hashes=frozenset({canonical_hash(LINEAR_SCALE_MODULE)}))
    pairs = select_archive_pairs(sakana_rows(), config, report, per_task=None, min_archive_speedup=1.2)
    assert [p.metadata.get("CUDA_Speedup_Native") for p in pairs] == [1.4]
    assert report.dropped["slow_in_archive"] == 3  # 1.1, its duplicate and the unknown speedup
    report = FilterReport()
    pairs = select_archive_pairs(
        sakana_rows(), SFTBuildConfig(), report, per_task=None, exclude_tasks=frozenset({(1, 19)})
    )
    assert [p.metadata["task_id"] for p in pairs] == [7] and report.dropped["overlaps_eval_problem"] == 3


def test_example_uses_the_cuda_prompt_and_metadata() -> None:
    pair = archive_pair(sakana_rows()[0], 0, SFTBuildConfig())
    example = single_turn_example(pair, default_prompt("cuda"))
    assert example.messages[0]["content"] == default_prompt("cuda").system
    assert example.messages[-1]["content"].startswith("```python\nimport torch")
    assert example.metadata["source"] == "sakana" and example.metadata["sakana"]["task_id"] == 19
    assert example.metadata["problem_hash"] and math.isclose(
        example.metadata["sakana"]["CUDA_Speedup_Native"], 1.1
    )


def test_verification_asks_for_the_cuda_backend() -> None:
    pairs = select_archive_pairs(sakana_rows(), SFTBuildConfig(), FilterReport(), per_task=None)
    bodies: list[dict] = []

    def respond(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        ok = "relu_strided_kernel" in body["candidate"]
        result = EvalResult(status="ok" if ok else "incorrect", compiled=True, correct=ok, feedback="f")
        return httpx.Response(200, json=result.to_json())

    async def run() -> list:
        async with EvalClient("http://e", transport=httpx.MockTransport(respond)) as client:
            return await verify_pairs(pairs, client, OPTIONS, report, backend="cuda")

    report = FilterReport()
    kept = asyncio.run(run())
    assert {b["options"]["backend"] for b in bodies} == {"cuda"} and len(bodies) == 3
    assert len(kept) == 1 and report.dropped["verify:incorrect"] == 2
