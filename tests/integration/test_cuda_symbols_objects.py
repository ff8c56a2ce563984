"""static.cuda_symbols on a build of two objects, as a CUDA extension is (main.o from the C++
sources, cuda.cuda.o from the CUDA ones; built here with the C++ compiler alone): a function one
object calls and the other defines is the build's own, not an outside call."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from eval_server.checks import cuda_symbols
from eval_server.pipeline import cuda_backend

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        cuda_backend.cxx() is None or shutil.which("nm") is None, reason="needs a C++ compiler and nm"
    ),
]

MAIN = "int relu_forward(int x);\nint entry(int x) { return relu_forward(x) + 1; }\n"


def _build(tmp_path: Path, kernel: str) -> tuple[Path, list[Path]]:
    cxx = cuda_backend.cxx()
    assert cxx is not None
    (tmp_path / "main.cpp").write_text(MAIN)
    (tmp_path / "cuda.cpp").write_text(kernel)
    objects = []
    for name in ("main", "cuda"):
        obj = tmp_path / f"{name}.o"
        subprocess.run([cxx, "-fPIC", "-c", str(tmp_path / f"{name}.cpp"), "-o", str(obj)], check=True)
        objects.append(obj)
    library = tmp_path / "probe.so"
    subprocess.run([cxx, "-shared", *map(str, objects), "-o", str(library)], check=True)
    return library, objects


def test_a_function_defined_in_another_object_of_the_build_is_not_an_outside_call(tmp_path: Path):
    library, objects = _build(tmp_path, "int relu_forward(int x) { return x > 0 ? x : 0; }\n")
    assert cuda_symbols.check_build(library, objects, cuda_backend.cxx()) is None


def test_an_outside_call_in_either_object_is_refused(tmp_path: Path):
    kernel = '#include <dlfcn.h>\nint relu_forward(int x) { return dlopen("x", 0) ? x : 0; }\n'
    library, objects = _build(tmp_path, kernel)
    check = cuda_symbols.check_build(library, objects, cuda_backend.cxx())
    assert check is not None and "dlopen" in check.message and "relu_forward" not in check.message
