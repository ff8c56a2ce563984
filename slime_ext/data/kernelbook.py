"""KernelBook rows -> (KernelBench-format reference, `ModelNew` Triton answer) pairs.

A KernelBook row (GPUMODE/KernelBook, parquet/json/jsonl) holds a PyTorch module (`python_code`:
`class <entry_point>(nn.Module)`, `get_inputs()`, and `get_init_inputs()` returning
`[[positional args], {keyword args}]`) and the Triton code TorchInductor generated for it
(`triton_code`: `@triton.jit` kernels, a `call(args)` launcher and `class <entry_point>New`).
Other columns (`uuid`, `module_name`, `repo_name`, `licenses`, ...) are kept as metadata.

The eval server and the RL prompts speak KernelBench: `class Model`, `get_init_inputs()` returning
the constructor's positional arguments, and a candidate `class ModelNew`. So:
- `to_reference`: rename the entry class to `Model` and turn `[[args], {kwargs}]` into the
  positional list (keywords placed by the constructor's signature, gaps filled with its defaults);
- `to_answer`: rename `<entry_point>New` to `ModelNew`, then translate Inductor's private runtime
  glue to public API (`inductor.py`).
Every renaming goes through the AST (`source_edit.py`). A row that cannot be converted raises
`Rejected` with a short reason id that the SFT report counts.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eval_server.checks.source_ast import is_triton_jit  # one definition of a kernel
from eval_server.checks.static import run_static_checks
from krl_common.validation import ValidationError
from slime_ext.data.inductor import UnsupportedInductorCode, rewrite_inductor_glue
from slime_ext.data.kernelbench import check_problem_source
from slime_ext.data.source_edit import Edit, apply_edits, node_span, rename_identifier

__all__ = [
    "REQUIRED_COLUMNS",
    "KernelBookRow",
    "Rejected",
    "answer_rejection",
    "canonical_hash",
    "jsonable",
    "launched_kernels",
    "parse_kernelbook_row",
    "to_answer",
    "to_reference",
]

REQUIRED_COLUMNS = ("python_code", "triton_code", "entry_point")
_METADATA_COLUMNS = ("module_name", "repo_name", "repo_link", "licenses", "synthetic", "stars", "sha")


class Rejected(Exception):
    """A row that cannot become an SFT example; `reason` is a short id counted in the report."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class KernelBookRow:
    key: str  # the row's `uuid` (or its index in the file when the column is absent)
    entry_point: str
    python_code: str
    triton_code: str
    metadata: dict[str, Any] = field(default_factory=dict)


def jsonable(value: Any) -> Any:
    """A table cell as JSON metadata (numpy scalars and other objects as their text)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def parse_kernelbook_row(data: Mapping[str, Any], index: int, where: str = "") -> KernelBookRow:
    """One table row. A missing column means the file is not KernelBook (ValidationError); empty
    or non-string values are a bad row (Rejected "invalid_row")."""
    missing = [c for c in REQUIRED_COLUMNS if c not in data]
    if missing:
        raise ValidationError(
            f"{where or 'row'} {index}: missing column(s) {missing}; KernelBook rows have {list(REQUIRED_COLUMNS)}"
        )
    for c in REQUIRED_COLUMNS:
        if not isinstance(data[c], str) or not data[c].strip():
            raise Rejected("invalid_row", f"column {c!r} is empty or not a string")
    uuid = data.get("uuid")
    key = str(uuid) if uuid is not None else f"row{index}"
    metadata = {c: jsonable(data[c]) for c in _METADATA_COLUMNS if c in data and data[c] is not None}
    return KernelBookRow(
        key=key,
        entry_point=data["entry_point"].strip(),
        python_code=data["python_code"],
        triton_code=data["triton_code"],
        metadata=metadata,
    )


def _parse(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise Rejected(f"{what}_syntax", f"line {exc.lineno}: {exc.msg}") from None


def _top_level(tree: ast.Module, kind: type, name: str) -> Any:
    return next((n for n in tree.body if isinstance(n, kind) and n.name == name), None)


def _positional_init(source: str, tree: ast.Module, value: ast.expr, cls: ast.ClassDef) -> str:
    """`[[a, b], {"k": v}]` -> the text of the equivalent positional list for cls.__init__."""
    args_node, kw_node = value.elts  # type: ignore[attr-defined]
    if any(isinstance(a, ast.Starred) for a in args_node.elts):
        raise Rejected("init_inputs_unsupported", "starred positional argument")
    texts = [ast.get_source_segment(source, a) or "" for a in args_node.elts]
    keywords: dict[str, ast.expr] = {}
    for k, v in zip(kw_node.keys, kw_node.values, strict=True):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            raise Rejected("init_inputs_unsupported", "keyword names must be string literals")
        keywords[k.value] = v
    if keywords:
        init = _top_level(cls, ast.FunctionDef, "__init__")  # type: ignore[arg-type]
        if init is None:
            raise Rejected("init_inputs_unsupported", "keyword arguments but no __init__")
        params = [*init.args.posonlyargs, *init.args.args][1:]  # without self
        defaults: dict[str, ast.expr] = dict(
            zip(
                [p.arg for p in params][len(params) - len(init.args.defaults) :],
                init.args.defaults,
                strict=True,
            )
        )
        for p in params[len(texts) :]:
            if not keywords:
                break
            node = keywords.pop(p.arg, None) or defaults.get(p.arg)
            if node is None:
                raise Rejected("init_inputs_unsupported", f"argument {p.arg!r} has no value and no default")
            texts.append(ast.get_source_segment(source, node) or "")
        if keywords:
            raise Rejected(
                "init_inputs_unsupported", f"keyword-only or unknown argument(s) {sorted(keywords)}"
            )
    if any(not t for t in texts):
        raise Rejected("init_inputs_unsupported", "argument source not recoverable")
    return "[" + ", ".join(texts) + "]"


def _fix_init_inputs(source: str) -> str:
    tree = ast.parse(source)
    fn = _top_level(tree, ast.FunctionDef, "get_init_inputs")
    cls = _top_level(tree, ast.ClassDef, "Model")
    if fn is None or cls is None:
        return source  # check_problem_source names what is missing
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        raise Rejected("init_inputs_unsupported", "get_init_inputs must have one return statement")
    value = returns[0].value
    if not isinstance(value, ast.List | ast.Tuple):
        raise Rejected("init_inputs_unsupported", "get_init_inputs must return a list literal")
    if not value.elts:
        return source
    if not (
        len(value.elts) == 2
        and isinstance(value.elts[0], ast.List | ast.Tuple)
        and isinstance(value.elts[1], ast.Dict)
    ):
        raise Rejected("init_inputs_unsupported", "get_init_inputs is not KernelBook's [[args], {kwargs}]")
    start, end = node_span(source, value)
    return apply_edits(source, [Edit(start, end, _positional_init(source, tree, value, cls))])


def to_reference(row: KernelBookRow) -> str:
    """The row's PyTorch module as a KernelBench problem (`Model`, positional get_init_inputs)."""
    tree = _parse(row.python_code, "reference")
    if _top_level(tree, ast.ClassDef, row.entry_point) is None:
        raise Rejected("reference_no_entry_class", f"no top-level class {row.entry_point!r}")
    source = row.python_code
    if row.entry_point != "Model":
        try:
            source = rename_identifier(source, row.entry_point, "Model")
        except ValueError as exc:
            raise Rejected("reference_name_clash", str(exc)) from None
    source = _fix_init_inputs(source)
    try:
        check_problem_source(source, "reference")
    except ValidationError as exc:
        raise Rejected("reference_not_kernelbench", str(exc)) from None
    return source


def to_answer(row: KernelBookRow) -> str:
    """The row's Triton code as a candidate: `class ModelNew`, public-API runtime glue."""
    tree = _parse(row.triton_code, "answer")
    name = f"{row.entry_point}New"
    if _top_level(tree, ast.ClassDef, name) is None:
        ends_new = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("New")]
        if len(ends_new) != 1:
            raise Rejected("answer_no_new_class", f"no class {name!r} (classes ending in New: {ends_new})")
        name = ends_new[0]
    source = row.triton_code
    if name != "ModelNew":
        try:
            source = rename_identifier(source, name, "ModelNew")
        except ValueError as exc:
            raise Rejected("answer_name_clash", str(exc)) from None
    try:
        return rewrite_inductor_glue(source)
    except UnsupportedInductorCode as exc:
        raise Rejected("answer_inductor_unsupported", str(exc)) from None


def launched_kernels(source: str, class_name: str = "ModelNew") -> list[str]:
    """Names of the `@triton.jit` kernels launched (`kernel[grid](...)`) on the way from
    `class_name.forward` through the module's own functions and methods, sorted."""
    tree = ast.parse(source)
    jit = {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and any(is_triton_jit(d) for d in n.decorator_list)
    }
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name not in jit}
    cls = _top_level(tree, ast.ClassDef, class_name)
    if cls is None:
        return []
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    todo = [methods["forward"]] if "forward" in methods else []
    seen: set[int] = set()
    launched: set[str] = set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in jit:
                launched.add(func.value.id)
            elif isinstance(func, ast.Name) and func.id in functions:
                todo.append(functions[func.id])
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and func.attr in methods
            ):
                todo.append(methods[func.attr])
    return sorted(launched)


def answer_rejection(answer: str, *, allow_extern_kernels: bool = False) -> Rejected | None:
    """Why the answer cannot be an SFT target (None when it can): work done by torch/cuBLAS
    through Inductor's `extern_kernels`, no Triton kernel launched from forward, or one of the
    eval server's static rules (the RL reward would reject it, SFT must not teach it)."""
    tree = ast.parse(answer)
    if not allow_extern_kernels:
        uses = sorted(
            {
                f"extern_kernels.{n.attr}"
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "extern_kernels"
            }
        )
        if uses:
            return Rejected("answer_extern_kernels", ", ".join(uses))
    if not launched_kernels(answer):
        return Rejected("answer_no_launched_kernel", "ModelNew.forward launches no @triton.jit kernel")
    for check in run_static_checks(tree):
        if check.severity == "reject":
            return Rejected(f"static:{check.id}", check.message)
    return None


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def canonical_hash(source: str) -> str:
    """sha256 of the source's AST without docstrings, comments or formatting: the dedup key (two
    copies of one module from different forks hash alike), also used for overlap with KernelBench."""
    try:
        text = ast.unparse(_strip_docstrings(ast.parse(source)))
    except SyntaxError:
        text = source
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
