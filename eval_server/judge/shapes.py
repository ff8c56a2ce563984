"""The second input shape every correct candidate is also checked on (kernels hard-coded to the
benchmark's shapes, a reward hack reported in 2026).

Rule: the problem's module-level integer constants that `get_inputs` reads and neither
`get_init_inputs` nor anything else in the module does (so the model and its weights stay what
they are), each n > 1 replaced by 3n//4 + 1: every such dimension shrinks and, for the usual
powers of two, becomes odd, so a kernel that assumes the benchmark's size or its divisibility by a
block size is wrong there. A problem with no such constant, or whose reference does not run at
the new shape, has no second shape.
"""

from __future__ import annotations

import ast
from typing import Any


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def scaled_constants(source: str) -> dict[str, tuple[int, int]]:
    """{name: (the problem's value, the second shape's value)} by the module docstring's rule."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    consts: dict[str, int] = {}
    inputs: set[str] = set()
    elsewhere: set[str] = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and type(node.value.value) is int
        ):
            consts[node.targets[0].id] = node.value.value
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "get_inputs":
            inputs |= _names(node)
        else:
            elsewhere |= _names(node)
    return {
        name: (value, value * 3 // 4 + 1)
        for name, value in consts.items()
        if name in inputs and name not in elsewhere and value > 1
    }


def describe(scaled: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{name} = {new} (the problem's {old})" for name, (old, new) in scaled.items())


def apply(module: Any, scaled: dict[str, tuple[int, int]]) -> None:
    """Set the second shape's constants on a (separately imported) copy of the problem."""
    for name, (_, new) in scaled.items():
        setattr(module, name, new)
