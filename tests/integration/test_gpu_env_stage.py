"""scripts/gpu_env/stage.sh offline, on what it does without a package index: reading locks,
slime's patches into a wheel, pieces for the device's carry limit and back, the offline install,
the import check. (`download` itself needs PyPI: docs/GPU_TESTS.md records its runs.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
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


def _wheel(dist: Path, name: str, version: str, files: dict[str, str], scripts: str = "") -> Path:
    """A pure-Python py3-none-any wheel of `name` holding `files` (path -> text), made with the wheel
    tool; `scripts`: console_scripts lines (`cmd = module:function`), which pip puts into bin/."""
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / f"{name}-{version}"
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "WHEEL").write_text(
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        (info / "RECORD").write_text("")
        if scripts:
            (info / "entry_points.txt").write_text(f"[console_scripts]\n{scripts}\n")
        subprocess.run(
            [sys.executable, "-m", "wheel", "pack", "-d", str(dist), str(root)],
            check=True,
            capture_output=True,
        )
    (wheel,) = dist.glob(f"{name}-{version}-*.whl")
    return wheel


def _tiny_wheel(dist: Path, name: str = "sglang", version: str = "0.0.1") -> Path:
    """A pure-Python wheel of `name` whose package says `hello`."""
    return _wheel(dist, name, version, {f"{name}/__init__.py": 'GREETING = "hello"\n'})


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


def _fake_sglang_kernel(dist: Path, version: str = "0.4.4") -> Path:
    """An sglang_kernel wheel laid out as the real one: FA3, FlashMLA, common_ops per architecture."""
    root = dist / "src" / f"sglang_kernel-{version}"
    members = {
        "sgl_kernel/__init__.py": b"from sgl_kernel.load_utils import *\n",
        "sgl_kernel/load_utils.py": b"SUBDIR = 'sm90'\n",
        "sgl_kernel/flash_ops.abi3.so": os.urandom(30_000),
        "sgl_kernel/flashmla_ops.abi3.so": os.urandom(5_000),
        "sgl_kernel/sm100/common_ops.abi3.so": os.urandom(8_000),
        "sgl_kernel/sm90/common_ops.abi3.so": os.urandom(8_000),
    }
    for name, data in members.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    info = root / f"sglang_kernel-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang-kernel\nVersion: {version}\n")
    (info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp310-abi3-manylinux2014_x86_64\n"
    )
    (info / "RECORD").write_text("")
    subprocess.run(
        [sys.executable, "-m", "wheel", "pack", "-d", str(dist), str(root)], check=True, capture_output=True
    )
    (wheel,) = dist.glob(f"sglang_kernel-{version}-*.whl")
    return wheel


def _contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if ".dist-info/" not in n}


def test_trim_takes_fa3_flashmla_and_sm100_out_of_the_kernel_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    original = _fake_sglang_kernel(wheels)
    before = _contents(original)
    res = _stage("trim", wheels)
    assert res.returncode == 0, res.stderr
    (trimmed,) = wheels.glob("*.whl")  # the original replaced
    assert trimmed.name == "sglang_kernel-0.4.4-1trim-cp310-abi3-manylinux2014_x86_64.whl"
    assert " MB -> " in res.stderr, res.stderr  # the sizes before and after
    gone = {
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/flashmla_ops.abi3.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
    }
    assert _contents(trimmed) == {n: d for n, d in before.items() if n not in gone}  # the rest byte for byte
    with zipfile.ZipFile(trimmed) as zf:
        assert "Build: 1trim" in zf.read("sglang_kernel-0.4.4.dist-info/WHEEL").decode()
        record = zf.read("sglang_kernel-0.4.4.dist-info/RECORD").decode()
    assert (
        "sgl_kernel/sm90/common_ops.abi3.so" in record and "flash_ops" not in record and "sm100" not in record
    )

    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    where = ["--platform", "manylinux2014_x86_64", "--python-version", "3.12"]  # the GPU machine's, from here
    pip += [*where, "--only-binary=:all:", "--find-links", str(wheels), "--target", str(site)]
    subprocess.run([*pip, "sglang-kernel==0.4.4"], check=True, capture_output=True, timeout=120)
    installed = {p.relative_to(site).as_posix() for p in (site / "sgl_kernel").rglob("*") if p.is_file()}
    assert installed == {n for n in before if n not in gone}

    packed = trimmed.read_bytes()
    res = _stage("trim", wheels)  # again: nothing to do, nothing changed
    assert res.returncode == 0 and "already trimmed" in res.stderr, res.stderr
    assert list(wheels.glob("*.whl")) == [trimmed] and trimmed.read_bytes() == packed
    (tmp_path / "empty").mkdir()
    res = _stage("trim", tmp_path / "empty")
    assert res.returncode == 0 and "no sglang_kernel wheel" in res.stderr, res.stderr


def _fake_checkout(path: Path, marker: str) -> Path:
    """A git checkout holding `marker` and a committed file, then changed in the working tree."""
    (path / marker).parent.mkdir(parents=True, exist_ok=True)
    (path / marker).write_text("# marker\n")
    (path / "code.py").write_text("VALUE = 'committed'\n")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    (path / "code.py").write_text("VALUE = 'patched'\n")  # as fetch_upstream.sh leaves its patches
    (path / "new_file.py").write_text("NEW = 1\n")
    return path


def test_the_sources_travel_with_their_working_tree_changes_and_without_git(tmp_path: Path) -> None:
    slime = _fake_checkout(tmp_path / "up" / "slime", "train.py")
    megatron = _fake_checkout(tmp_path / "up" / "Megatron-LM", "megatron/core/__init__.py")
    env = {"SLIME_DIR": str(slime), "MEGATRON_DIR": str(megatron)}
    dest = tmp_path / "src-pack"
    res = _stage("sources", dest, env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["Megatron-LM.tar.gz", "slime.tar.gz"]  # no .part left

    target = tmp_path / "there"
    (target / "slime").mkdir(parents=True)
    (target / "slime" / "stale.py").write_text("")  # an older copy is replaced whole
    res = _stage("unsources", dest, target)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"export SLIME_DIR={target}/slime MEGATRON_DIR={target}/Megatron-LM\n"
    for name, marker in (("slime", "train.py"), ("Megatron-LM", "megatron/core/__init__.py")):
        tree = target / name
        assert (tree / "code.py").read_text() == "VALUE = 'patched'\n"
        assert (tree / "new_file.py").is_file() and (tree / marker).is_file()
        assert not (tree / ".git").exists() and not (tree / "stale.py").exists()
    assert sorted(p.name for p in target.iterdir()) == ["Megatron-LM", "slime"]  # no temporary left

    script = f'eval "$(bash {STAGE} unsources {dest} {target})" && echo "$SLIME_DIR|$MEGATRON_DIR"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{target}/slime|{target}/Megatron-LM"


def test_a_missing_source_is_named_with_where_to_get_it(tmp_path: Path) -> None:
    slime = _fake_checkout(tmp_path / "slime", "train.py")
    dest = tmp_path / "src-pack"
    res = _stage("sources", dest, env={"SLIME_DIR": str(slime), "MEGATRON_DIR": str(tmp_path / "nowhere")})
    assert res.returncode == 1, res.stderr
    assert "no Megatron-LM source" in res.stderr and "scripts/fetch_upstream.sh" in res.stderr, res.stderr
    assert not dest.exists()  # nothing written
    res = _stage("unsources", tmp_path / "nothing-here", tmp_path / "there")
    assert res.returncode == 1 and "run `stage.sh sources`" in res.stderr, res.stderr


BOOTSTRAP = STAGE.parent / "bootstrap.sh"
REPO = STAGE.parents[2]


def _tiny_sdist(dist: Path, name: str, version: str, files: dict[str, str], packages: list[str]) -> Path:
    """A setuptools source distribution of `name` holding `files`, named as `stage.sh install` looks
    for a build-there pin's (`name_version.tar.gz`)."""
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / f"{name}-{version}"
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        (root / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
            f"[tool.setuptools]\npackages = {packages!r}\n".replace("'", '"')
        )
        out = dist / f"{name}-{version}.tar.gz"
        with tarfile.open(out, "w:gz") as tf:
            tf.add(root, arcname=root.name)
    return out


def _bundle(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A bundle as bootstrap.sh's header makes it, in small: fake wheels for three small locks (two
    console scripts from two installs, so bin/ is merged; a folder shared by a wheel and a build-there
    source distribution, as TE's transformer_engine/; one package in two versions, as NumPy in site/
    and np/) and src/ from fake slime and Megatron-LM checkouts; packed into several pieces. Returns
    the pieces' folder and the environment naming the locks."""
    bundle = tmp_path / "bundle"
    for d in ("eval", "trainer", "np"):
        (bundle / d).mkdir(parents=True)
    main = "def main():\n    print('{} says hi')\n"
    _wheel(
        bundle / "eval",
        "fakeeval",
        "0.1.0",
        {"fakeeval/__init__.py": main.format("fakeeval")},
        scripts="fakeeval-hello = fakeeval:main",
    )
    _wheel(
        bundle / "trainer",
        "faketrain",
        "0.2.0",
        {"faketrain/__init__.py": main.format("faketrain")},
        scripts="faketrain-hello = faketrain:main",
    )
    _wheel(bundle / "trainer", "fakete", "0.3.0", {"fakete/__init__.py": "", "fakete/common.py": "X = 1\n"})
    _tiny_sdist(
        bundle / "trainer",
        "fakete_torch",
        "0.3.0",
        {"fakete/pytorch/__init__.py": "Y = 2\n"},
        packages=["fakete.pytorch"],
    )
    for d, version in (("trainer", "2.0.0"), ("np", "1.0.0")):
        _wheel(bundle / d, "fakenum", version, {"fakenum/__init__.py": f"VERSION = '{version}'\n"})

    slime = _fake_checkout(tmp_path / "up" / "slime", "train.py")
    megatron = _fake_checkout(tmp_path / "up" / "Megatron-LM", "megatron/core/__init__.py")
    res = _stage("sources", bundle / "src", env={"SLIME_DIR": str(slime), "MEGATRON_DIR": str(megatron)})
    assert res.returncode == 0, res.stderr

    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "eval.lock").write_text("#import fakeeval\nfakeeval==0.1.0\n")
    (locks / "trainer.lock").write_text(
        "#import faketrain fakete.common\n#import fakete.pytorch fakenum\n"
        "faketrain==0.2.0\nfakete==0.3.0\nfakete-torch==0.3.0  # build-there\nfakenum==2.0.0\n"
    )
    (locks / "np.lock").write_text("#import fakenum\nfakenum==1.0.0\n")
    names = {"EVAL_LOCK": "eval.lock", "TRAINER_LOCK": "trainer.lock", "NUMPY_LOCK": "np.lock"}

    parts = tmp_path / "parts"
    res = _stage("pack", bundle, parts, env={"PIECE_BYTES": "8000"})
    assert res.returncode == 0, res.stderr
    assert len(list(parts.glob("stage.tar.*"))) >= 3
    return parts, {var: str(locks / name) for var, name in names.items()}


def _bootstrap(
    parts: Path, stage: Path | str, locks: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    unset = ("PYTHONPATH", "TRAINER_PYTHONPATH", "SLIME_DIR", "MEGATRON_DIR", "GPU_ENV_SITE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        ["bash", str(BOOTSTRAP), str(parts), str(stage)],
        capture_output=True,
        text=True,
        env={**env, "PYTHON": sys.executable, **locks},
        cwd=cwd,
        timeout=300,
    )


def _sourced(env_sh: Path, script: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`script` in bash after `source env_sh`, from a caller without PYTHONPATH."""
    return subprocess.run(
        [
            "bash",
            "-c",
            f"unset PYTHONPATH TRAINER_PYTHONPATH SLIME_DIR MEGATRON_DIR; source {shlex.quote(str(env_sh))}; {script}",
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def test_bootstrap_installs_the_staged_bundle_offline(tmp_path: Path) -> None:
    parts, locks = _bundle(tmp_path)
    stage = tmp_path / "stage"
    res = _bootstrap(parts, stage, locks)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "import check: all 4 modules import", res.stdout + res.stderr
    env_sh = stage / "env.sh"
    assert env_sh.is_file() and not (stage / "env.sh.part").exists()

    show = 'printf "%s\\n" "$PYTHONPATH" "$TRAINER_PYTHONPATH" "$SLIME_DIR" "$MEGATRON_DIR" "$PATH"'
    out = _sourced(env_sh, show)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{stage}/site:{REPO}",
        f"{stage}/np",
        f"{stage}/src/slime",
        f"{stage}/src/Megatron-LM",
        f"{stage}/site/bin:{os.environ['PATH']}",
    ]
    assert (stage / "src" / "slime" / "code.py").read_text() == "VALUE = 'patched'\n"
    assert (stage / "src" / "Megatron-LM" / "megatron" / "core" / "__init__.py").is_file()

    # Both console scripts, from two installs, in bin/; both parts of the shared folder.
    assert sorted(p.name for p in (stage / "site" / "bin").iterdir()) == ["fakeeval-hello", "faketrain-hello"]
    assert (stage / "site" / "fakete" / "common.py").is_file()
    assert (stage / "site" / "fakete" / "pytorch" / "__init__.py").is_file()
    py = sys.executable
    script = (
        f"{py} -c 'import fakeeval, faketrain, fakete.common, fakete.pytorch, fakenum; print(fakenum.VERSION)'"
        f' && PYTHONPATH="$TRAINER_PYTHONPATH:$PYTHONPATH" {py} -c "import fakenum; print(fakenum.VERSION)"'
        " && fakeeval-hello && faketrain-hello"
    )
    out = _sourced(env_sh, script, cwd=tmp_path / "locks")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["2.0.0", "1.0.0", "fakeeval says hi", "faketrain says hi"]

    # Again: nothing to install, the same env.sh, the check passes.
    before = env_sh.read_text()
    res = _bootstrap(parts, stage, locks)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.count("nothing missing") == 3 and "installed to" not in res.stderr, res.stderr
    assert "import check: all 4 modules import" in res.stdout
    assert env_sh.read_text() == before

    # A damaged piece: stage.sh's message, and no env.sh written (the old one left as it was).
    piece = sorted(parts.glob("stage.tar.*"))[1]
    data = piece.read_bytes()
    piece.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    for where in (tmp_path / "fresh", stage):
        res = _bootstrap(parts, where, locks)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "a piece in" in res.stderr and "is missing or damaged" in res.stderr, res.stderr
    assert not (tmp_path / "fresh" / "env.sh").exists()
    assert env_sh.read_text() == before


@pytest.mark.parametrize("name", ["stage", "my stage"])
def test_bootstraps_env_sh_holds_from_any_directory(tmp_path: Path, name: str) -> None:
    """STAGE given as a relative path: env.sh's paths are absolute, as `source STAGE/env.sh` is used
    from other working directories (the launcher's Ray job, the eval workers); a path with a space
    stays one path."""
    parts, locks = _bundle(tmp_path)
    res = _bootstrap(parts, name, locks, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    stage = tmp_path / name
    show = 'printf "%s\\n" "$PYTHONPATH" "$TRAINER_PYTHONPATH" "${PATH%%:*}"'
    out = _sourced(stage / "env.sh", show, cwd=REPO.parent)
    assert out.stdout.splitlines() == [f"{stage}/site:{REPO}", f"{stage}/np", f"{stage}/site/bin"], out.stderr
