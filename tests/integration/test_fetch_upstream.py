"""scripts/fetch_upstream.sh against local git repositories standing in for GitHub (this machine
reaches no git host; SLIME_REPO_URL / MEGATRON_REPO_URL and the commit overrides point it at
them): the pinned commits checked out, slime's two Megatron patches applied in order with
--3way, a second run changing nothing, and the refusals (another commit, not a checkout, a bad
URL, other local changes, bad arguments) that leave what was there alone and remove only what the run created."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "fetch_upstream.sh"
ORIGINAL = "def f():\n    return 1\n"
PATCHED = "def f():\n    return 2  # sglang-aligned\n"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def _repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "c")
    return _git(path, "rev-parse", "HEAD")


def _diff(before: str, after: str, name: str = "megatron/core.py") -> str:
    """A git diff of one file, as slime's patches are."""
    import difflib

    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}")
    return f"diff --git a/{name} b/{name}\n" + "".join(lines)


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, str]:
    """A Megatron-LM repo and a slime repo carrying its two patches, as environment overrides."""
    mega = _repo(tmp_path / "up" / "Megatron-LM", {"megatron/core.py": ORIGINAL})
    step = "def f():\n    return 2\n"
    patches = {
        "docker/patch/latest/megatron.patch": _diff(ORIGINAL, step),
        "docker/patch/latest/megatron-sglang-aligned.patch": _diff(step, PATCHED),
        "slime/__init__.py": "",
    }
    slime = _repo(tmp_path / "up" / "slime", patches)
    return {
        "SLIME_REPO_URL": f"file://{tmp_path / 'up' / 'slime'}", "SLIME_COMMIT": slime,
        "MEGATRON_REPO_URL": f"file://{tmp_path / 'up' / 'Megatron-LM'}", "MEGATRON_COMMIT": mega,
    }  # fmt: skip


def _fetch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_fetch_patch_and_run_again(upstream: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "third_party"
    res = _fetch(upstream, str(dest))
    assert res.returncode == 0, res.stderr
    assert _git(dest / "slime", "rev-parse", "HEAD") == upstream["SLIME_COMMIT"]
    assert _git(dest / "Megatron-LM", "rev-parse", "HEAD") == upstream["MEGATRON_COMMIT"]
    assert (dest / "Megatron-LM/megatron/core.py").read_text() == PATCHED  # both patches, in order
    assert "applied megatron-sglang-aligned.patch" in res.stderr
    again = _fetch(upstream, str(dest))
    assert again.returncode == 0, again.stderr
    assert "already at" in again.stderr and "patches already applied" in again.stderr
    assert (dest / "Megatron-LM/megatron/core.py").read_text() == PATCHED


def test_refusals_leave_what_was_there(upstream: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "tp"
    (dest / "slime").mkdir(parents=True)
    (dest / "slime" / "keep.txt").write_text("mine")
    res = _fetch(upstream, str(dest))
    assert res.returncode == 1 and "is not a git checkout of slime" in res.stderr
    assert (dest / "slime" / "keep.txt").read_text() == "mine" and not (dest / "Megatron-LM").exists()

    other = tmp_path / "tp2"
    assert _fetch(upstream, str(other)).returncode == 0
    res = _fetch({**upstream, "MEGATRON_COMMIT": upstream["SLIME_COMMIT"]}, str(other))
    assert res.returncode == 1 and "not the pinned Megatron-LM commit" in res.stderr
    assert (other / "Megatron-LM/megatron/core.py").read_text() == PATCHED  # untouched
    (other / "Megatron-LM/megatron/core.py").write_text("edited\n")
    res = _fetch(upstream, str(other))
    assert res.returncode == 1 and "changes that are not slime's patches" in res.stderr
    assert (other / "Megatron-LM/megatron/core.py").read_text() == "edited\n"

    fresh = tmp_path / "tp3"
    res = _fetch({**upstream, "MEGATRON_REPO_URL": f"file://{tmp_path / 'nowhere'}"}, str(fresh))
    assert res.returncode == 1 and "could not fetch" in res.stderr
    assert not (fresh / "slime").exists() and not (fresh / "Megatron-LM").exists()  # created, removed


def test_arguments() -> None:
    assert _fetch({}, "--help").returncode == 0
    res = _fetch({}, "a", "b")
    assert res.returncode == 2 and "at most one argument" in res.stderr
    res = _fetch({}, "--bogus")
    assert res.returncode == 2 and "unknown option" in res.stderr
