"""KernelBench problems from a local copy: a checkout's `KernelBench/level<N>/<id>_<Name>.py` tree
or the Hugging Face dataset files (parquet/jsonl with columns `code`, `level`, `name`,
`problem_id`; `name` is the file name, e.g. `19_ReLU.py`).

Every problem is checked before it becomes a prompt: it must parse and define `class Model`,
`get_inputs()` and `get_init_inputs()` at top level (what the eval server loads). A bad problem is
an error that names its file, never a silently shorter dataset.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krl_common.validation import ValidationError
from slime_ext.data.files import TABLE_SUFFIXES, read_rows
from slime_ext.rollout.problems import PromptRecord

__all__ = [
    "KernelBenchProblem",
    "check_problem_source",
    "load_kernelbench",
    "to_prompt_record",
]

_FILE_RE = re.compile(r"^(\d+)_(\w.*)\.py$")
_LEVEL_DIR_RE = re.compile(r"^level(\d+)$")
_HF_COLUMNS = ("code", "level", "name", "problem_id")
_REQUIRED_DEFS = (
    ("Model", ast.ClassDef),
    ("get_inputs", ast.FunctionDef),
    ("get_init_inputs", ast.FunctionDef),
)


@dataclass(frozen=True)
class KernelBenchProblem:
    level: int
    number: int  # KernelBench's problem_id: the file-name prefix, 1-based within a level
    name: str  # file name without the number and `.py`, e.g. "ReLU"
    source: str
    origin: str  # where it came from: a path relative to the input, or "<file>#row=<i>"

    @property
    def problem_id(self) -> str:
        """KernelBench's own file stem, e.g. `19_ReLU` (used in reports)."""
        return f"{self.number}_{self.name}"

    @property
    def instance_id(self) -> str:
        """Unique key across levels (the GRPO group key), e.g. `kb_L1_019`."""
        return f"kb_L{self.level}_{self.number:03d}"


def check_problem_source(source: str, where: str) -> None:
    """Raise ValidationError (naming `where`) unless `source` is a loadable KernelBench problem."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValidationError(f"{where}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    top = {(type(n), n.name) for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    missing = [name for name, kind in _REQUIRED_DEFS if (kind, name) not in top]
    if missing:
        raise ValidationError(f"{where}: not a KernelBench problem, no top-level {', '.join(missing)}")


def _level_dirs(root: Path) -> dict[int, Path]:
    dirs: dict[int, Path] = {}
    for base in (root, root / "KernelBench"):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            m = _LEVEL_DIR_RE.match(child.name)
            if m and child.is_dir():
                dirs.setdefault(int(m.group(1)), child)
        if dirs:
            break
    return dirs


def _from_tree(root: Path, level_dirs: dict[int, Path]) -> Iterator[KernelBenchProblem]:
    for level, folder in sorted(level_dirs.items()):
        for path in sorted(folder.glob("*.py")):
            if path.name == "__init__.py":
                continue
            m = _FILE_RE.match(path.name)
            if not m:
                raise ValidationError(f"{path}: file name is not <number>_<Name>.py")
            yield KernelBenchProblem(
                level=level,
                number=int(m.group(1)),
                name=m.group(2),
                source=path.read_text(encoding="utf-8"),
                origin=path.relative_to(root).as_posix(),
            )


def _int_field(value: Any, where: str, column: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(f"{where}: column {column!r} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(f"{where}: column {column!r} must be an integer, got {value!r}") from None
    if number < 1:
        raise ValidationError(f"{where}: column {column!r} must be >= 1, got {number}")
    return number


def _from_table(path: Path, root: Path) -> Iterator[KernelBenchProblem]:
    rel = path.relative_to(root).as_posix() if path != root and root in path.parents else path.name
    for i, row in enumerate(read_rows(path)):
        where = f"{path}#row={i}"
        missing = [c for c in _HF_COLUMNS if c not in row]
        if missing:
            raise ValidationError(
                f"{where}: missing column(s) {missing}; a KernelBench table has {list(_HF_COLUMNS)}"
            )
        code, name = row["code"], row["name"]
        if not isinstance(code, str) or not code.strip():
            raise ValidationError(f"{where}: column 'code' must be a non-empty string")
        if not isinstance(name, str) or not name.strip():
            raise ValidationError(f"{where}: column 'name' must be a non-empty string")
        number = _int_field(row["problem_id"], where, "problem_id")
        level = _int_field(row["level"], where, "level")
        stem = name.strip().removesuffix(".py")
        stem = stem.removeprefix(f"{number}_") if stem.startswith(f"{number}_") else stem
        yield KernelBenchProblem(level=level, number=number, name=stem, source=code, origin=f"{rel}#row={i}")


def _table_files(root: Path) -> list[Path]:
    for base in (root / "data", root):
        if base.is_dir():
            files = sorted(p for p in base.iterdir() if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
            if files:
                return files
    return []


def _iter_source(path: Path) -> Iterator[KernelBenchProblem]:
    if path.is_file():
        yield from _from_table(path, path.parent)
        return
    if not path.is_dir():
        raise FileNotFoundError(f"KernelBench input not found: {path}")
    level_dirs = _level_dirs(path)
    if level_dirs:
        yield from _from_tree(path, level_dirs)
        return
    files = _table_files(path)
    if not files:
        raise ValidationError(
            f"{path}: no KernelBench problems found (expected level<N>/ folders, KernelBench/level<N>/, "
            f"or dataset files {', '.join(TABLE_SUFFIXES)} in it or in data/)"
        )
    for f in files:
        yield from _from_table(f, path)


def load_kernelbench(
    path: str | os.PathLike[str], levels: Iterable[int] | None = None
) -> list[KernelBenchProblem]:
    """Every problem under `path` (a checkout, a dataset folder, or one table file), sorted by
    (level, number), optionally only the given levels. Raises ValidationError on any bad problem,
    on duplicates, or when a requested level has no problem."""
    wanted = set(levels) if levels is not None else None
    problems: dict[tuple[int, int], KernelBenchProblem] = {}
    for p in _iter_source(Path(path)):
        if wanted is not None and p.level not in wanted:
            continue
        check_problem_source(p.source, p.origin)
        key = (p.level, p.number)
        if key in problems:
            raise ValidationError(
                f"duplicate KernelBench problem level {p.level} number {p.number}: "
                f"{problems[key].origin} and {p.origin}"
            )
        problems[key] = p
    if wanted is not None:
        empty = sorted(wanted - {lv for lv, _ in problems})
        if empty:
            raise ValidationError(f"{path}: no problems for level(s) {empty}")
    if not problems:
        raise ValidationError(f"{path}: no KernelBench problems found")
    return [problems[k] for k in sorted(problems)]


def to_prompt_record(problem: KernelBenchProblem, split: str) -> PromptRecord:
    """The prompt record of one problem; metadata carries what the curriculum and reports use."""
    return PromptRecord(
        instance_id=problem.instance_id,
        level=problem.level,
        problem_id=problem.problem_id,
        name=problem.name,
        reference=problem.source,
        split=split,
        metadata={
            "source": "kernelbench",
            "origin": problem.origin,
            "kernelbench_problem_id": problem.number,
            "reference_lines": problem.source.count("\n") + 1,
        },
    )
