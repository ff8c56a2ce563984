"""AI CUDA Engineer Archive rows -> (KernelBench reference, KernelBench-CUDA `ModelNew`) pairs.

The archive (SakanaAI/AI-CUDA-Engineer-Archive, parquet splits level_1/level_2/level_3) holds
generated CUDA kernels for KernelBench tasks. Per row: `Level_ID`, `Task_ID`, `Op_Name`,
`Kernel_Name`; the task as `PyTorch_Code_Module` (KernelBench's `class Model`) and as
`PyTorch_Code_Functional` (the same `Model` whose `forward(self, x, ..., fn=module_fn)` returns
`fn(x, <parameters>)`, `module_fn` being the PyTorch implementation); `CUDA_Code` (a torch
extension: `__global__` kernels and a C++ `forward` bound with its own `PYBIND11_MODULE`);
`Correct`, `Max_Diff`, `Error`; runtimes and `CUDA_Speedup_Native` / `CUDA_Speedup_Compile`.

The candidate format of the `cuda` backend is one Python file: so `to_cuda_answer` takes the
functional module, drops `module_fn`, renames `Model` to `ModelNew`, makes `forward` call the
extension's `forward` in place of `fn`, and puts the CUDA source in front of it, compiled with
`load_inline` (no generated bindings: the source binds `forward` itself). Parameters are created
exactly as in the functional module, so with the same seed they equal the reference's.
A row that cannot be used raises `Rejected` (its reason is counted in the SFT report).
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from eval_server.checks.cuda_static import SOURCE_RULES, strip_comments
from krl_common.validation import ValidationError
from slime_ext.data.kernelbench import check_problem_source
from slime_ext.data.kernelbook import Rejected, canonical_hash, jsonable
from slime_ext.data.report import FilterReport
from slime_ext.data.sft_build import Pair, SFTBuildConfig
from slime_ext.data.source_edit import Edit, Offsets, apply_edits, node_span, rename_identifier

__all__ = [
    "REQUIRED_COLUMNS",
    "archive_pair",
    "archive_speedup",
    "cuda_answer_rejection",
    "parse_archive_row",
    "select_archive_pairs",
    "to_cuda_answer",
]

REQUIRED_COLUMNS = (
    "Level_ID",
    "Task_ID",
    "CUDA_Code",
    "PyTorch_Code_Module",
    "PyTorch_Code_Functional",
    "Correct",
)
_METADATA_COLUMNS = (
    "Op_Name",
    "Kernel_Name",
    "CUDA_Runtime",
    "PyTorch_Native_Runtime",
    "PyTorch_Compile_Runtime",
    "CUDA_Speedup_Native",
    "CUDA_Speedup_Compile",
    "Max_Diff",
)
EXTENSION = "_cuda_ext"  # the name the answer gives the compiled extension

# The evaluator's own source rules for CUDA/C++ (eval_server.checks.cuda_static): an SFT answer must be
# code the reward would accept. The torch-compute rule maps to its own drop reason (and
# --allow-extern-kernels keeps such answers); every other rule to answer_evaluator_rule.
_TORCH_COMPUTE_RULE = "static.cuda_torch_compute"


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def parse_archive_row(data: Mapping[str, Any], index: int, where: str = "") -> tuple[str, dict[str, Any]]:
    """(row key, metadata) of one archive row, after the row-level filters: a missing column means
    the file is not the archive (ValidationError); an empty field is `invalid_row`, a kernel the
    archive marks incorrect `not_correct`."""
    missing = [c for c in REQUIRED_COLUMNS if c not in data]
    if missing:
        raise ValidationError(
            f"{where or 'row'} {index}: missing column(s) {missing}; archive rows have {list(REQUIRED_COLUMNS)}"
        )
    for c in ("CUDA_Code", "PyTorch_Code_Module", "PyTorch_Code_Functional"):
        if not isinstance(data[c], str) or not data[c].strip():
            raise Rejected("invalid_row", f"column {c!r} is empty or not a string")
    try:
        level, task = int(data["Level_ID"]), int(data["Task_ID"])
    except (TypeError, ValueError):
        ids = f"{data['Level_ID']!r}/{data['Task_ID']!r}"
        raise Rejected("invalid_row", f"Level_ID/Task_ID not integers: {ids}") from None
    if data["Correct"] is not True:
        raise Rejected("not_correct", str(data.get("Error") or "")[:300])
    digest = hashlib.sha256(data["CUDA_Code"].encode("utf-8")).hexdigest()
    metadata = {c: jsonable(data[c]) for c in _METADATA_COLUMNS if _present(data.get(c))}
    metadata.update(level=level, task_id=task)
    return f"L{level}_T{task}_{digest[:12]}", metadata


def archive_speedup(metadata: Mapping[str, Any]) -> float | None:
    """The archive's speedup over eager PyTorch (None when absent or not a finite number)."""
    value = metadata.get("CUDA_Speedup_Native")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _forward_fn(cls: ast.ClassDef) -> tuple[ast.FunctionDef, str, str]:
    """`forward`, the name of its function parameter and of that parameter's default function."""
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        raise Rejected("functional_unsupported", "Model has no forward")
    args = forward.args
    last = args.args[-1] if args.args else None
    if (
        last is None
        or len(args.defaults) < 1
        or not isinstance(args.defaults[-1], ast.Name)
        or args.vararg
        or args.kwonlyargs
        or args.kwarg
    ):
        raise Rejected("functional_unsupported", "forward does not end with a parameter `fn=<function>`")
    return forward, last.arg, args.defaults[-1].id  # type: ignore[attr-defined]


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def to_cuda_answer(functional: str, cuda_code: str, name: str) -> str:
    """The functional module as a KernelBench-CUDA candidate: `ModelNew` calling the extension
    `name`, built by `load_inline` from `cuda_code`. Raises Rejected when the module is not the
    archive's functional form (then no mechanical rewrite is safe)."""
    try:
        tree = ast.parse(functional)
    except SyntaxError as exc:
        raise Rejected("functional_syntax", f"line {exc.lineno}: {exc.msg}") from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if cls is None:
        raise Rejected("functional_unsupported", "no top-level class Model")
    forward, param, impl = _forward_fn(cls)
    impl_def = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == impl), None)
    names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
    calls = {
        id(n.func) for n in ast.walk(forward) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    param_uses = [n for n in ast.walk(forward) if isinstance(n, ast.Name) and n.id == param]
    if (
        impl_def is None
        or sum(n.id == impl for n in names) != 1
        or any(id(n) not in calls for n in param_uses)
    ):
        raise Rejected(
            "functional_unsupported", f"{impl} is used beyond forward's default, or {param} beyond calls"
        )
    if '"""' in cuda_code or cuda_code.endswith("\\"):
        raise Rejected("answer_unquotable", "the CUDA source cannot be put in a raw triple-quoted string")
    o = Offsets(functional)
    before = forward.args.args[-2] if len(forward.args.args) > 1 else None
    if before is None:
        raise Rejected("functional_unsupported", "forward has no self parameter")
    _, cut_from = node_span(functional, before, o)
    _, cut_to = node_span(functional, forward.args.defaults[-1], o)
    edits = [Edit(cut_from, cut_to, "")]  # `, fn=module_fn` out of the signature
    edits += [Edit(*node_span(functional, n, o), f"{EXTENSION}.forward") for n in param_uses]
    # The implementation (and the blank lines after it) gives way to the CUDA source and its build.
    following = tree.body[tree.body.index(impl_def) + 1 :]
    end = o.starts[_first_line(following[0]) - 1] if following else len(functional)
    block = (
        f'cuda_source = r"""\n{cuda_code.strip(chr(10))}\n"""\n\n'
        "# The source binds `forward` itself (PYBIND11_MODULE): no functions= to generate.\n"
        f'{EXTENSION} = load_inline(name="{name}", cpp_sources="", cuda_sources=cuda_source, verbose=False)\n\n\n'
    )
    edits.append(Edit(o.starts[_first_line(impl_def) - 1], end, block))
    imports = [
        n for n in tree.body[: tree.body.index(impl_def)] if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    at = o.starts[imports[-1].end_lineno] if imports else 0  # type: ignore[index]
    edits.append(Edit(at, at, "from torch.utils.cpp_extension import load_inline\n"))
    source = apply_edits(functional, edits)
    try:
        return rename_identifier(source, "Model", "ModelNew")
    except ValueError as exc:
        raise Rejected("answer_name_clash", str(exc)) from None


def cuda_answer_rejection(cuda_code: str, *, allow_torch_ops: bool = False) -> Rejected | None:
    """Why the CUDA source cannot be an SFT target (None when it can): no `__global__` kernel
    launched with `<<<...>>>`, no `forward` binding, or a source rule of the evaluator's `cuda`
    backend fires (torch/ATen compute unless allowed, libraries, streams, host escapes, PTX)."""
    code = strip_comments(cuda_code)
    if "__global__" not in code or "<<<" not in code:
        return Rejected("answer_no_kernel", "no __global__ kernel launched with <<<...>>>")
    if not re.search(r"PYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME", code) or not re.search(
        r"\.def\(\s*\"forward\"", code
    ):
        return Rejected("answer_no_binding", 'no PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) defining "forward"')
    for rule_id, (_, find) in SOURCE_RULES.items():
        if allow_torch_ops and rule_id == _TORCH_COMPUTE_RULE:
            continue
        hits = list(dict.fromkeys(find(code)))
        if hits:
            reason = "answer_torch_ops" if rule_id == _TORCH_COMPUTE_RULE else "answer_evaluator_rule"
            return Rejected(reason, f"{rule_id}: " + ", ".join(hits[:8]))
    return None


def archive_pair(data: Mapping[str, Any], index: int, config: SFTBuildConfig, where: str = "") -> Pair:
    """One archive row as a (reference, answer) pair, or Rejected with the reason."""
    key, metadata = parse_archive_row(data, index, where)
    reference = data["PyTorch_Code_Module"]
    try:
        check_problem_source(reference, "reference")
    except ValidationError as exc:
        raise Rejected("reference_not_kernelbench", str(exc)) from None
    rejection = cuda_answer_rejection(data["CUDA_Code"], allow_torch_ops=config.allow_extern_kernels)
    if rejection is not None:
        raise rejection
    answer = to_cuda_answer(data["PyTorch_Code_Functional"], data["CUDA_Code"], f"cuda_{key.lower()}")
    if len(reference) > config.max_reference_chars or len(answer) > config.max_answer_chars:
        raise Rejected("too_long", f"reference {len(reference)} chars, answer {len(answer)} chars")
    return Pair(key=key, reference=reference, answer=answer, metadata=metadata, source="sakana")


def select_archive_pairs(
    rows: Iterable[Mapping[str, Any]],
    config: SFTBuildConfig,
    report: FilterReport,
    *,
    where: str = "",
    per_task: int | None = 4,
    min_archive_speedup: float | None = None,
    exclude_tasks: frozenset[tuple[int, int]] = frozenset(),
) -> list[Pair]:
    """Convert and filter archive rows; per KernelBench task keep the `per_task` fastest kernels
    (by the archive's `CUDA_Speedup_Native`, unknown last; None: all). Tasks in `exclude_tasks`
    ((level, number)) or whose module is in `config.exclude_hashes` are dropped, as are kernels
    identical to an earlier one (`config.dedup`). Output: by level, task, then speed."""
    by_task: dict[tuple[int, int], list[Pair]] = {}
    seen: dict[str, str] = {}
    for index, data in enumerate(rows):
        report.rows += 1
        try:
            pair = archive_pair(data, index, config, where)
        except Rejected as r:
            report.drop(r.reason, f"row{index}", r.detail)
            continue
        task = (pair.metadata["level"], pair.metadata["task_id"])
        speedup = archive_speedup(pair.metadata)
        digest = pair.key.rsplit("_", 1)[1]
        if min_archive_speedup is not None and (speedup is None or speedup < min_archive_speedup):
            report.drop("slow_in_archive", pair.key, f"archive speedup {speedup} < {min_archive_speedup}")
        elif task in exclude_tasks or canonical_hash(pair.reference) in config.exclude_hashes:
            report.drop("overlaps_eval_problem", pair.key, f"level {task[0]} task {task[1]}")
        elif config.dedup and digest in seen:
            report.drop("duplicate", pair.key, f"same CUDA source as {seen[digest]}")
        else:
            seen[digest] = pair.key
            by_task.setdefault(task, []).append(pair)
    kept: list[Pair] = []
    for task in sorted(by_task):
        ranked = sorted(by_task[task], key=lambda p: -(archive_speedup(p.metadata) or -math.inf))
        limit = len(ranked) if per_task is None else per_task
        kept.extend(ranked[:limit])
        for pair in ranked[limit:]:
            report.drop("per_task_limit", pair.key, f"level {task[0]} task {task[1]}: {per_task} faster kept")
    return kept
