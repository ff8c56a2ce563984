"""Edit Python source at places located by its AST, keeping every other byte as written.

Renaming a class with `ast.unparse` would reformat the whole module and drop its comments; a
regex would also rename matches inside strings, comments and attribute names. Here the AST says
exactly which tokens are the identifier (definitions and `Name` nodes, never attributes or
strings), and only those characters are replaced. Every edit is checked by re-parsing.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

__all__ = [
    "Edit",
    "Offsets",
    "apply_edits",
    "def_name_span",
    "node_span",
    "rename_identifier",
    "statement_removal",
]


@dataclass(frozen=True)
class Edit:
    """Replace source characters [start, end) (absolute character offsets) with `text`."""

    start: int
    end: int
    text: str


class Offsets:
    """AST positions (1-based line, UTF-8 byte column) -> absolute character offsets."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def char(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(
            line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace")
        )


def node_span(source: str, node: ast.AST, offsets: Offsets | None = None) -> tuple[int, int]:
    """Absolute character range of a node (statement or expression)."""
    o = offsets or Offsets(source)
    return o.char(node.lineno, node.col_offset), o.char(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined,arg-type]


def def_name_span(
    source: str, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
) -> tuple[int, int]:
    """Character range of the name in `class NAME` / `def NAME`: the first NAME token after the
    keyword (decorators come before `node.lineno`, so they are never in the way)."""
    start, end = node_span(source, node)
    reader = io.StringIO(source[start:end]).readline
    seen_keyword = False
    for tok in tokenize.generate_tokens(reader):
        if tok.type != tokenize.NAME:
            continue
        if not seen_keyword:
            seen_keyword = tok.string in ("class", "def")  # `async def`: skip `async`
            continue
        if tok.string != node.name:
            break
        text_before = source[start:end].splitlines(keepends=True)
        offset = sum(len(line) for line in text_before[: tok.start[0] - 1]) + tok.start[1]
        return start + offset, start + offset + len(node.name)
    raise ValueError(f"could not locate the name of {type(node).__name__} {node.name!r}")


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply non-overlapping edits; raises ValueError if two overlap."""
    out: list[str] = []
    pos = 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.start < pos:
            raise ValueError(f"overlapping source edits at character {e.start}")
        out.append(source[pos : e.start])
        out.append(e.text)
        pos = e.end
    out.append(source[pos:])
    return "".join(out)


def rename_identifier(source: str, old: str, new: str) -> str:
    """Rename a module's identifier `old` to `new`: its class/def definitions and every `Name`
    node (loads, stores, `super(Old, self)`), not attributes, strings or comments.

    Raises ValueError if `new` is already used in the module (the rename would merge two names).
    """
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id == new) or (
            isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == new
        ):
            raise ValueError(
                f"cannot rename {old!r} to {new!r}: {new!r} is already used (line {node.lineno})"
            )
    offsets = Offsets(source)
    edits: list[Edit] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == old:
            start, end = node_span(source, node, offsets)
            edits.append(Edit(start, end, new))
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == old:
            start, end = def_name_span(source, node)
            edits.append(Edit(start, end, new))
    result = apply_edits(source, edits)
    check = ast.parse(result)  # a broken edit is a bug here, never a silently corrupted answer
    if any(isinstance(n, ast.Name) and n.id == old for n in ast.walk(check)):
        raise ValueError(f"rename of {old!r} left references behind")
    return result


def statement_removal(
    source: str, stmt: ast.stmt, siblings: list[ast.stmt], offsets: Offsets | None = None
) -> Edit:
    """An edit that removes one statement: its whole lines when it stands alone on them and is not
    the only statement of its block, otherwise replaced by `pass` (the block must stay valid)."""
    o = offsets or Offsets(source)
    start, end = node_span(source, stmt, o)
    line_start = o.starts[stmt.lineno - 1]
    line_end = o.starts[min(stmt.end_lineno or stmt.lineno, len(o.lines))]
    alone = not source[line_start:start].strip() and not source[end:line_end].strip()
    if alone and len(siblings) > 1:
        return Edit(line_start, line_end, "")
    return Edit(start, end, "pass")
