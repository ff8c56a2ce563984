"""The import order of the repository, read from the source (AST), so it cannot rot silently.

Three rules (docs/ARCHITECTURE.md):
1. Packages import downwards only: krl_common <- eval_server <- slime_ext <- buffer_server <- tools,
   bench. Nothing outside tests imports `tests`; tools and bench do not import each other.
2. Inside a package, the units are its folders and its top-level modules; the graph of imports
   between them has no cycle.
3. Each folder's `__init__.py` says what its modules may import, on a line `May import: ...`
   (dotted prefixes, or `nothing of this project`); every import in the folder stays within its
   own folder or those prefixes.
Every import counts: top level, inside functions, and `from package import module` forms.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"krl_common": 0, "eval_server": 1, "slime_ext": 2, "buffer_server": 3, "tools": 4, "bench": 4}
PACKAGES = ("krl_common", "eval_server", "slime_ext", "buffer_server")
PROJECT = set(LEVELS) | {"tests"}
# Candidate sources: code the evaluator runs as data, not part of the import graph.
DATA_DIRS = (
    "eval_server/samples/candidates",
    "eval_server/samples/problems",
    "bench/candidates",
    "bench/problems",
)
MAY_IMPORT = re.compile(r"^May import:\s*(.+?)\s*(?:\n\s*\n|\Z)", re.M | re.S)


def _sources(top: str) -> list[Path]:
    return [p for p in sorted((ROOT / top).rglob("*.py")) if not any(d in p.as_posix() for d in DATA_DIRS)]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(dotted: str) -> bool:
    return (ROOT / Path(*dotted.split(".")) / "__init__.py").is_file()


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every project module `path` imports; `from pkg import mod`
    counts as importing `pkg.mod` when `mod` is a module, else as importing `pkg`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    this = _module_name(path)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in PROJECT]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = this.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] not in PROJECT:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                is_module = _is_package(sub) or (ROOT / Path(*sub.split("."))).with_suffix(".py").is_file()
                found.append((node.lineno, sub if is_module else module))
    return found


def _all_imports() -> list[tuple[Path, int, str]]:
    return [(p, line, mod) for top in LEVELS for p in _sources(top) for line, mod in project_imports(p)]


def test_packages_import_downwards_only() -> None:
    wrong = []
    for path, line, mod in _all_imports():
        src = path.relative_to(ROOT).parts[0]
        dst = mod.split(".")[0]
        if dst == "tests" or (dst != src and LEVELS[dst] >= LEVELS[src]):
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not wrong, "imports against the package order:\n" + "\n".join(wrong)


def _unit(package: str, module: str) -> str | None:
    """The unit inside `package` that `module` belongs to: its first-level folder or module."""
    parts = module.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return ".".join(parts[:2])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_cycle_between_folders(package: str) -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in _sources(package):
        src = _unit(package, _module_name(path))
        for _, mod in project_imports(path):
            dst = _unit(package, mod)
            if src and dst and dst != src:
                graph[src].add(dst)
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle between the units of {package}: {' -> '.join(cycle)}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_sees_a_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}}) is None


def _folders() -> list[Path]:
    return [p.parent for top in PACKAGES for p in _sources(top) if p.name == "__init__.py"]


def test_every_folder_says_what_it_may_import() -> None:
    missing = [str(d.relative_to(ROOT)) for d in _folders() if not MAY_IMPORT.search(_docstring(d))]
    assert not missing, "folders whose __init__ docstring has no 'May import:' line: " + ", ".join(missing)


def _docstring(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""


def allowed_prefixes(folder: Path) -> list[str]:
    text = " ".join(MAY_IMPORT.search(_docstring(folder)).group(1).split())
    if text.startswith("nothing of this project"):
        return []
    return [p.strip(" .`") for p in text.split(",") if p.strip(" .`")]


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: str(p.relative_to(ROOT)))
def test_folder_imports_only_what_it_says(folder: Path) -> None:
    own = _module_name(folder / "__init__.py")
    allowed = allowed_prefixes(folder)
    wrong = []
    for path in sorted(folder.rglob("*.py")):
        if any(d in path.as_posix() for d in DATA_DIRS):
            continue
        for line, mod in project_imports(path):
            ok = [own] + allowed
            if not any(mod == p or mod.startswith(p + ".") for p in ok):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not wrong, f"{own} may import {allowed or 'nothing of this project'}, but:\n" + "\n".join(wrong)
