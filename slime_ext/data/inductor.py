"""Rewrite the TorchInductor runtime glue of KernelBook answers into public PyTorch/Triton API.

KernelBook's Triton code is Inductor output (PyTorch 2.5). Besides the `@triton.jit` kernels it
binds private helpers that the evaluator rejects (`torch._C` is a forbidden API: it can reach
into the evaluator) or that newer PyTorch no longer has (`triton_heuristics.grid`):

    assert_size_stride = torch._C._dynamo.guards.assert_size_stride   # also assert_alignment
    empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
    reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
    from torch._C import _cuda_getCurrentRawStream as get_raw_stream   # + `get_raw_stream(0)` calls
    from torch._inductor.runtime.triton_heuristics import grid

`rewrite_inductor_glue` replaces each of those bindings with a small function of the same name
written with public API (torch.empty_strided, torch.as_strided, triton.cdiv), drops the unused
raw-stream calls, and leaves the kernels and the rest of the code byte for byte as they were.
Anything else private it cannot translate raises UnsupportedInductorCode with the reason.
"""

from __future__ import annotations

import ast

from eval_server.checks.source_ast import dotted_name  # the evaluator's own reading of dotted names
from slime_ext.data.source_edit import Edit, Offsets, apply_edits, statement_removal

__all__ = ["UnsupportedInductorCode", "rewrite_inductor_glue"]

_GUARDS = "torch._C._dynamo.guards."

# Attribute of torch._C._dynamo.guards (or name in triton_heuristics) -> public-API replacement.
# `{name}` is the name the answer bound it to.
_HELPERS: dict[str, str] = {
    "assert_size_stride": '''def {name}(tensor, size, stride):
    """Inductor's input guard: exact sizes, strides checked on dims longer than 1."""
    size, stride = tuple(size), tuple(stride)
    bad_stride = any(n > 1 and s != want for n, s, want in zip(size, tensor.stride(), stride))
    if tuple(tensor.shape) != size or bad_stride:
        raise AssertionError(f"expected size {{size}} stride {{stride}}, got {{tuple(tensor.shape)}} {{tensor.stride()}}")
''',
    "assert_alignment": """def {name}(tensor, alignment):
    if tensor.data_ptr() % alignment:
        raise AssertionError(f"expected a {{alignment}}-byte aligned tensor")
""",
    "_empty_strided_cuda": """def {name}(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cuda")
""",
    "_empty_strided_cpu": """def {name}(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")
""",
    "_reinterpret_tensor": """def {name}(tensor, size, stride, offset_increment=0):
    return torch.as_strided(tensor, size, stride, tensor.storage_offset() + offset_increment)
""",
    "grid": '''def {name}(*numels):
    """Inductor's launch grid: cdiv(numel, BLOCK) on the X, Y, Z axes, 1 on absent ones."""

    def grid_fn(meta):
        blocks = ("XBLOCK", "YBLOCK", "ZBLOCK")
        dims = [n if meta.get(b) is None else triton.cdiv(n, meta[b]) for n, b in zip(numels, blocks)]
        return tuple(dims) + (1,) * (3 - len(dims))

    return grid_fn
''',
}
_NEEDS = {"grid": "triton"}  # helper -> module it uses besides torch
_RAW_STREAM = "_cuda_getCurrentRawStream"


class UnsupportedInductorCode(ValueError):
    """The answer uses Inductor/private machinery this module cannot translate."""


def _blocks(tree: ast.AST) -> list[list[ast.stmt]]:
    """Every statement list in the module (bodies, else branches, handlers ...)."""
    out: list[list[ast.stmt]] = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                out.append(value)
    return out


def rewrite_inductor_glue(source: str) -> str:
    """The answer with Inductor's private bindings replaced by public-API helpers (see module doc).
    Source without any such binding is returned unchanged."""
    tree = ast.parse(source)
    offsets = Offsets(source)
    edits: list[Edit] = []
    helpers: dict[str, str] = {}  # bound name -> helper kind
    raw_stream_names: set[str] = set()
    removed: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and dotted_name(stmt.value).startswith(_GUARDS):
            attr = dotted_name(stmt.value)[len(_GUARDS) :]
            if attr not in _HELPERS or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise UnsupportedInductorCode(f"line {stmt.lineno}: torch._C._dynamo.guards.{attr}")
            helpers[stmt.targets[0].id] = attr
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "torch._C":
            for alias in stmt.names:
                if alias.name != _RAW_STREAM:
                    raise UnsupportedInductorCode(f"line {stmt.lineno}: from torch._C import {alias.name}")
                raw_stream_names.add(alias.asname or alias.name)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "torch._inductor.runtime.triton_heuristics":
            for alias in stmt.names:
                if alias.name != "grid":
                    raise UnsupportedInductorCode(f"line {stmt.lineno}: triton_heuristics.{alias.name}")
                helpers[alias.asname or alias.name] = "grid"
        else:
            continue
        removed.add(id(stmt))
        edits.append(statement_removal(source, stmt, tree.body, offsets))
    if not edits:
        return source

    # Raw-stream calls only select a CUDA stream handle that Inductor code never uses: drop them.
    for block in _blocks(tree):
        for stmt in block:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name)
                and stmt.value.func.id in raw_stream_names
            ):
                removed.add(id(stmt.value.func))
                edits.append(statement_removal(source, stmt, block, offsets))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in raw_stream_names and id(node) not in removed:
            raise UnsupportedInductorCode(f"line {node.lineno}: the raw CUDA stream handle is used")

    imported = {
        (a.asname or a.name).split(".")[0] for s in tree.body if isinstance(s, ast.Import) for a in s.names
    }
    needed = {"torch"} | {_NEEDS[kind] for kind in helpers.values() if kind in _NEEDS}
    header = "".join(f"import {m}\n" for m in sorted(needed - imported))
    text = "\n\n".join(_HELPERS[kind].format(name=name) for name, kind in helpers.items())
    kept_imports = [
        s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom) and id(s) not in removed
    ]
    at = offsets.starts[kept_imports[-1].end_lineno] if kept_imports else 0  # type: ignore[index]
    edits.append(Edit(at, at, f"{header}\n\n{text}" if kept_imports else f"{header}{text}\n\n"))
    result = apply_edits(source, edits)
    ast.parse(result)
    return result
