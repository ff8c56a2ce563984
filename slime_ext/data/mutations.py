"""Deterministic wrong variants of a correct Triton answer, used as failing first attempts.

Multi-turn SFT needs a first attempt that fails and the evaluator's real feedback on it. When no
model attempts are available, `flip_arithmetic` makes one: it swaps one arithmetic operator
(+ <-> -, * -> +) inside a launched `@triton.jit` kernel, preferring value computations
(`tmp` names in Inductor kernels) over index arithmetic. Only the operator characters change.
Whether the variant really fails is decided by the eval server, never assumed here.
"""

from __future__ import annotations

import ast
import hashlib

from slime_ext.data.kernelbook import launched_kernels
from slime_ext.data.source_edit import Edit, Offsets, apply_edits, node_span

__all__ = ["flip_arithmetic"]

_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "+")}


def _is_value_op(node: ast.BinOp) -> bool:
    return any(isinstance(s, ast.Name) and s.id.startswith("tmp") for s in (node.left, node.right))


def flip_arithmetic(answer: str, salt: str = "") -> str | None:
    """The answer with one operator flipped in a launched kernel (chosen by `salt`), or None when
    no kernel has an arithmetic operator to flip."""
    tree = ast.parse(answer)
    launched = set(launched_kernels(answer))
    ops: list[ast.BinOp] = [
        node
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef) and fn.name in launched
        for node in ast.walk(fn)
        if isinstance(node, ast.BinOp) and type(node.op) in _SWAP
    ]
    preferred = [op for op in ops if _is_value_op(op)] or ops
    if not preferred:
        return None
    preferred.sort(key=lambda n: (n.lineno, n.col_offset))
    index = int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(preferred)
    node = preferred[index]
    offsets = Offsets(answer)
    _, left_end = node_span(answer, node.left, offsets)
    right_start, _ = node_span(answer, node.right, offsets)
    between = answer[left_end:right_start]  # whitespace, closing/opening parens and the operator
    old, new = _SWAP[type(node.op)]
    at = between.index(old)
    return apply_edits(answer, [Edit(left_end + at, left_end + at + len(old), new)])
