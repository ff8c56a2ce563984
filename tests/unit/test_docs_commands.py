"""The commands the docs tell people to run name files and modules that exist: every repository
path (scripts/, configs/, tools/, bench/, docs/, tests/, the packages) and every `python -m X`
module of this repository in the ```bash blocks of README.md and docs/*.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OURS = ("scripts/", "configs/", "tools/", "bench/", "docs/", "tests/", "eval_server/", "slime_ext/",
        "buffer_server/", "krl_common/", "docker/")  # fmt: skip
_PATH = re.compile(r"(?<![\w./$-])((?:" + "|".join(re.escape(p) for p in OURS) + r")[\w./-]*\w)(?![\w*./-])")
_MODULE = re.compile(r"python3? -m ([\w.]+)")
_PACKAGES = ("tools", "bench", "eval_server", "slime_ext", "buffer_server", "krl_common")


def _blocks(doc: Path) -> list[str]:
    return re.findall(r"```(?:bash|sh|shell)\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)


def _module_exists(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_command_blocks_name_existing_paths_and_modules(doc: Path) -> None:
    missing = []
    for block in _blocks(doc):
        for path in _PATH.findall(block):
            if any(ch in path for ch in "*{}<>") or path.endswith("/"):
                continue
            if not (REPO / path).exists() and not (REPO / path).parent.joinpath(Path(path).name).exists():
                missing.append(path)
        for module in _MODULE.findall(block):
            if module.split(".")[0] in _PACKAGES and not _module_exists(module):
                missing.append(f"python -m {module}")
    assert not missing, f"{doc.name}: commands name what does not exist: {sorted(set(missing))}"
