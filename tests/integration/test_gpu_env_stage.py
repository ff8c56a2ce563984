"""scripts/gpu_env/stage.sh offline, on what it does without a package index: reading locks,
slime's patches into a wheel, pieces for the device's carry limit and back, the offline install,
the import check. (`download` itself needs PyPI: docs/GPU_TESTS.md records its runs.)"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

STAGE = Path(__file__).resolve().parents[2] / "scripts" / "gpu_env" / "stage.sh"


def _stage(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(STAGE), *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        timeout=300,
    )


def _tiny_wheel(dist: Path, name: str = "sglang", version: str = "0.0.1") -> Path:
    """A pure-Python wheel of `name` whose package says `hello`, made with the wheel tool."""
    root = dist / "src" / f"{name}-{version}"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text('GREETING = "hello"\n')
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    (info / "RECORD").write_text("")
    subprocess.run(
        [sys.executable, "-m", "wheel", "pack", "-d", str(dist), str(root)], check=True, capture_output=True
    )
    (wheel,) = dist.glob(f"{name}-{version}-*.whl")
    return wheel


def _fake_slime(tmp_path: Path) -> Path:
    """A slime source tree holding one sglang patch, against the repository's python/ directory."""
    slime = tmp_path / "slime"
    patches = slime / "docker" / "patch" / "latest"
    patches.mkdir(parents=True)
    (patches / "sglang.patch").write_text(
        "diff --git a/python/sglang/__init__.py b/python/sglang/__init__.py\n"
        "--- a/python/sglang/__init__.py\n"
        "+++ b/python/sglang/__init__.py\n"
        "@@ -1 +1 @@\n"
        '-GREETING = "hello"\n'
        '+GREETING = "patched by slime"\n'
    )
    return slime


def test_a_lock_line_it_cannot_read_stops_the_command(tmp_path: Path) -> None:
    lock = tmp_path / "bad.lock"
    lock.write_text("flask==3.1.3\nrequests>=2  # a range, not a pin\n")
    res = _stage("patch", lock, tmp_path / "wheels")
    assert res.returncode == 1 and "cannot read: requests>=2" in res.stderr, res.stderr


def test_slimes_patches_go_into_the_wheel_which_installs_offline(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_wheel(wheels)
    lock = tmp_path / "t.lock"
    lock.write_text("#import sglang\nsglang==0.0.1  # slime-patch\n")
    env = {"SLIME_DIR": str(_fake_slime(tmp_path))}
    res = _stage("patch", lock, wheels, env=env)
    assert res.returncode == 0, res.stderr
    (patched,) = wheels.glob("sglang-0.0.1-*.whl")
    assert "-1slime-" in patched.name  # the original is replaced, the version kept
    with zipfile.ZipFile(patched) as zf:
        assert 'GREETING = "patched by slime"' in zf.read("sglang/__init__.py").decode()
    assert _stage("patch", lock, wheels, env=env).returncode == 0  # again: nothing left to patch

    site = tmp_path / "site"
    res = _stage("install", lock, wheels, site)
    assert res.returncode == 0, res.stderr
    assert (site / "sglang" / "__init__.py").read_text() == 'GREETING = "patched by slime"\n'
    export = res.stdout.strip()
    assert export.startswith(f"export PYTHONPATH={site}:")
    res = _stage("check", lock, env={"PYTHONPATH": str(site)})
    assert res.returncode == 0 and "all 1 modules import" in res.stdout, res.stdout + res.stderr


def test_a_patch_that_does_not_apply_is_an_error(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    original = _tiny_wheel(wheels)
    slime = _fake_slime(tmp_path)
    patch = slime / "docker" / "patch" / "latest" / "sglang.patch"
    patch.write_text(patch.read_text().replace('-GREETING = "hello"', '-GREETING = "other"'))
    lock = tmp_path / "t.lock"
    lock.write_text("sglang==0.0.1  # slime-patch\n")
    res = _stage("patch", lock, wheels, env={"SLIME_DIR": str(slime)})
    assert res.returncode == 1 and "does not apply" in res.stderr, res.stderr
    assert original.exists()  # nothing lost


def test_pieces_travel_and_come_back_checked(tmp_path: Path) -> None:
    src = tmp_path / "wheels"
    src.mkdir()
    for i in range(3):
        (src / f"pkg{i}.whl").write_bytes(os.urandom(40_000))
    parts = tmp_path / "parts"
    res = _stage("pack", src, parts, env={"PIECE_BYTES": "25000"})
    assert res.returncode == 0, res.stderr
    pieces = sorted(parts.glob("stage.tar.*"))
    assert len(pieces) >= 5 and all(p.stat().st_size <= 25_000 for p in pieces)

    back = tmp_path / "back"
    assert _stage("unpack", parts, back).returncode == 0
    for i in range(3):
        assert (back / f"pkg{i}.whl").read_bytes() == (src / f"pkg{i}.whl").read_bytes()

    pieces[1].unlink()  # one piece did not arrive
    res = _stage("unpack", parts, tmp_path / "broken")
    assert res.returncode == 1 and "missing or damaged" in res.stderr
    assert not (tmp_path / "broken").exists()


def test_the_import_check_names_every_module_that_fails(tmp_path: Path) -> None:
    lock = tmp_path / "t.lock"
    lock.write_text("#import json no_such_module_here\n#import also_missing\n")
    res = _stage("check", lock)
    assert res.returncode == 1
    assert "no_such_module_here" in res.stdout and "also_missing" in res.stdout and "json:" not in res.stdout


def test_install_takes_only_the_pins_whose_version_is_not_there(tmp_path: Path) -> None:
    from importlib import metadata

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_wheel(wheels, name="pytest", version="0.0.1")  # another version than the one running this
    lock = tmp_path / "t.lock"
    lock.write_text(f"pytest=={metadata.version('pytest')}\n")
    res = _stage("install", lock, wheels, tmp_path / "site")
    assert res.returncode == 0 and "nothing missing" in res.stderr, res.stderr
    lock.write_text("pytest==0.0.1\n")
    res = _stage("install", lock, wheels, tmp_path / "site")
    assert res.returncode == 0 and "installed to" in res.stderr, res.stderr
    assert (tmp_path / "site" / "pytest-0.0.1.dist-info").is_dir()


def test_the_locks_agree_on_every_package_they_share() -> None:
    """eval-tests.lock and trainer.lock install into one site: a package both pin must have one
    version, or the second install would find the other's and flip it."""

    def pins(name: str) -> dict[str, str]:
        out = {}
        for line in (STAGE.parent / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                pkg, version = line.split("==", 1)
                out[pkg.split("[")[0].lower().replace("_", "-")] = version.split()[0]
        return out

    a, b = pins("eval-tests.lock"), pins("trainer.lock")
    assert {n: (a[n], b[n]) for n in set(a) & set(b) if a[n] != b[n]} == {}
