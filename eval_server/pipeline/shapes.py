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
from pathlib import Path
from typing import Any

from eval_server.pipeline import loader


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


def import_variant(
    source: str, workdir: str | Path, stem: str
) -> tuple[Any, dict[str, tuple[int, int]]] | None:
    """The problem at its second shape and the constants scaled, or None when it has none. Called
    before any candidate code runs: the evaluation directory is writable by the candidate's
    process, so nothing is imported from it after the candidate is loaded."""
    scaled = scaled_constants(source)
    if not scaled:
        return None
    try:
        variant = loader.import_source(source, workdir, stem)
    except Exception:  # noqa: BLE001 - it imported as the reference a moment ago; no second shape
        return None
    apply(variant, scaled)
    return variant, scaled


def warm(variant: Any, model: Any, device: Any, seed: int) -> None:
    """One call of the candidate at the second shape, on inputs of the runner's own, so that its
    kernels' specializations for that shape compile here, in the runner's shared GPU hold that
    compiles let go of (compile_pause.py), and not in the judge's second-shape call, whose shared
    hold keeps other evaluations' timing waiting meanwhile (~0.26 s a fresh candidate, 1x H200).
    What the call returns or raises is for the judge's own call to find."""
    try:
        args = loader.make_inputs(variant, seed, device)
        model(*args)
    except Exception:  # noqa: BLE001, S110 - see the docstring
        pass
