"""How the static rules read Python source: dotted names, import aliases, calls, `@triton.jit`.

One reading shared by the Python rules (`static.py`), the CUDA backend's rules on the Python side
of a candidate (`cuda_static.py`) and the data tools that must recognise a kernel the way the
evaluator does (`slime_ext.data`). Pure AST functions: nothing is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator


def dotted_name(node: ast.AST) -> str:
    """'torch.nn.functional.relu' for an Attribute chain, '' when not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> canonical dotted name for every import (`import torch.nn.functional as F`
    binds F -> torch.nn.functional; `from torch import matmul as mm` binds mm -> torch.matmul)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:  # `import torch.nn` binds the top-level name only
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def canonical_name(name: str, aliases: dict[str, str]) -> str:
    head, _, rest = name.partition(".")
    base = aliases.get(head)
    if base is None:
        return name
    return f"{base}.{rest}" if rest else base


def is_triton_jit(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = dotted_name(target)
    return name in {"triton.jit", "jit", "tl.jit"} or name.endswith(".jit")


def calls(tree: ast.Module) -> Iterator[tuple[ast.Call, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, dotted_name(node.func)
