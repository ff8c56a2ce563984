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


def test_readme_names_every_window_the_dry_run_opens() -> None:
    """The README's dry-run paragraph lists the tmux windows; the launcher is where they are made."""
    launcher = (REPO / "scripts" / "run_kbench_multiturn.sh").read_text(encoding="utf-8")
    made = set(re.findall(r"^\s*windows\+=\((\w+)\)", launcher, flags=re.M))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"\(windows ((?:`\w+`(?:, )?)+)\)", readme)
    assert listed, "README: no '(windows `a`, `b`, ...)' list in the dry-run paragraph"
    assert set(re.findall(r"`(\w+)`", listed.group(1))) == made


def test_readme_dry_run_sample_shows_every_closing_line() -> None:
    """Each labelled line the dry run prints after its table (tools/dry_run.py) is in the README's
    sample output, in the same form."""
    source = (REPO / "tools" / "dry_run.py").read_text(encoding="utf-8")
    tail = source[source.index("print(format_summary(summary))") :]
    labels = re.findall(r'print\(f"([a-z][a-z ]*?:)\s', tail) + re.findall(r'print\(f"(dry run done in) ', tail)
    assert len(labels) >= 4, labels
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    fenced = re.split(r"^```.*$", readme, flags=re.M)[1::2]  # the insides of the fences
    sample = next(b for b in fenced if "trajectories:" in b)
    for label in labels:
        assert any(line.startswith(label) for line in sample.splitlines()), f"README sample lacks '{label} ...'"
    logs = re.search(r"\(([a-z, ]+)\)\"\)", tail[tail.index("logs:") :]).group(1)
    assert f"({logs})" in sample, f"README sample's logs line should list ({logs})"


def test_readme_layout_names_every_slime_ext_folder() -> None:
    row = next(line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `slime_ext/` |"))  # fmt: skip
    folders = sorted(p.name for p in (REPO / "slime_ext").iterdir() if (p / "__init__.py").is_file())
    missing = [f for f in folders if f"`{f}/`" not in row]
    assert not missing, f"README's layout row for slime_ext/ lacks {missing}"


def test_docs_speak_of_the_project_not_of_how_it_was_worked_on() -> None:
    """Dates, hardware and commits; no work-session counts, tracker issue numbers or the names
    of lent machine kinds."""
    pattern = re.compile(
        r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|previous|next|same) "
        r"session\b|\bissues? \d+|\bnvidia-h\d+(?:-x\d)?\b",
        flags=re.I,
    )
    found = [
        f"{doc.relative_to(REPO)}:{n}: {m.group(0)}"
        for doc in [*DOCS, *REPO.glob("*/README.md")]
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        for m in pattern.finditer(line)
    ]
    assert not found, found


def _launch_table() -> str:
    doc = (REPO / "docs" / "LAUNCH.md").read_text(encoding="utf-8")
    table = doc[doc.index("| variable | default | meaning |") :]
    return table[: table.index("\n\n")]


def test_every_setting_the_launchers_read_is_in_the_launch_table() -> None:
    """The launchers' settings are frozen by docs/LAUNCH.md's table: a variable a launcher, its
    sourced configs or the run plan reads with a default must be a row there, and every row must
    still be read (a new setting fails here until it is documented)."""
    files = [
        *(REPO / "scripts" / n for n in ("run_kbench_multiturn.sh", "run_sft.sh", "stop.sh", "preflight.sh")),
        *(REPO / "scripts" / "lib").glob("*.sh"),
        *(REPO / "configs" / "run").rglob("*.sh"),
        *(REPO / "configs" / "servers").glob("*.sh"),
    ]
    read: set[str] = set()
    for f in files:
        code = "\n".join(line for line in f.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#"))
        read |= set(re.findall(r'"\$\{([A-Z][A-Z0-9_]*):[=-]', code))
        read |= set(re.findall(r"\[\[ -v ([A-Z][A-Z0-9_]*) ", code))
    plan = (REPO / "tools" / "run_plan.py").read_text(encoding="utf-8")
    read |= set(re.findall(r'(?:\.get\(|_int\(settings, |env\[)"([A-Z][A-Z0-9_]+)"', plan))
    internal = {"TMPDIR", "CUDA_VISIBLE_DEVICES"} | {v for v in read if v.startswith("KRL_")}
    documented: set[str] = set()
    for row in _launch_table().splitlines()[2:]:
        documented |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1]))
    assert sorted(read - documented - internal) == [], "settings missing from docs/LAUNCH.md's table"
    assert sorted(documented - read - {"CUDA_VISIBLE_DEVICES"}) == [], "rows of settings nothing reads"


def test_every_gpu_test_file_is_in_the_reference_table() -> None:
    """docs/GPU_TESTS.md's current-status table has a row for every GPU test file (a new file fails
    here until it has one), and every file a row names exists."""
    doc = (REPO / "docs" / "GPU_TESTS.md").read_text(encoding="utf-8")
    section = re.search(r"^## Current status \(reference\)\n(.*?)(?=^## |\Z)", doc, flags=re.M | re.S)
    assert section, "docs/GPU_TESTS.md: no '## Current status (reference)' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")][2:]
    assert rows, "docs/GPU_TESTS.md: the current-status section has no table rows"
    named = {path for row in rows for path in re.findall(r"`(tests/gpu/[\w./-]+\.py)`", row.split("|")[1])}
    files = {f"tests/gpu/{p.name}" for p in (REPO / "tests" / "gpu").glob("test_*_gpu.py")}
    assert sorted(files - named) == [], "GPU test files without a row in docs/GPU_TESTS.md's current status"
    gone = sorted(p for p in named if not (REPO / p).is_file())
    assert gone == [], "rows naming GPU test files that do not exist"


@pytest.mark.parametrize("name", ["GPU_TESTS.md", "BENCHMARKS.md"])
def test_every_dated_record_names_its_commit(name: str) -> None:
    """A dated record's heading says which code it measured: a commit (or a range, or the commits of
    its parts), or plainly that none was recorded."""
    doc = (REPO / "docs" / name).read_text(encoding="utf-8")
    dated = [h for h in re.findall(r"^## (.+)$", doc, flags=re.M) if re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
    assert dated, f"docs/{name}: no dated record"
    bare = [h for h in dated if not re.search(r"\b[0-9a-f]{7,40}\b|commit not recorded|commits in each", h)]
    assert bare == [], f"docs/{name}: dated headings without a commit"
