"""The build cache's premise, with a real torch extension build (C++ only, so it runs on a CPU
machine): what one process built with load_inline into a key's directory, a fresh process loads
from there without rebuilding. The CUDA backend relies on it: the compile process builds outside
the GPU lock, the evaluation process only loads (eval_server/pipeline/cuda_backend.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from eval_server.checks import cuda_symbols
from eval_server.pipeline import cuda_backend
from eval_server.pipeline.cuda_backend import Extensions, InlineCall

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("ninja") is None or shutil.which(os.environ.get("CXX", "c++")) is None,
        reason="torch builds extensions with ninja and a C++ compiler; one of them is missing",
    ),
]


_STATIC_RUNTIME_CPP = (
    "#include <pybind11/pybind11.h>\n#include <sstream>\n#include <string>\n{extra}"
    "int64_t parse(int64_t x) {{\n"
    "  std::ostringstream text; text << x; {body}\n"
    "  return (int64_t)std::stoul(text.str());\n"
    "}}\n"
)


def _static_runtime_call(name: str, extra: str = "", body: str = "") -> InlineCall:
    return InlineCall.bind(
        (),
        {
            "name": name,
            "cpp_sources": _STATIC_RUNTIME_CPP.format(extra=extra, body=body),
            "functions": ["parse"],
            "extra_ldflags": ["-static-libstdc++"],  # as the GCC of the lent GPU machines links
            # pybind11 alone instead of torch/extension.h: ~13 s to build instead of ~2 min of a
            # CI core, and what these probes test (the C++ runtime's symbols) is the same
            "no_implicit_headers": True,
            "with_pytorch_error_handling": False,
        },
    )


CALLS = {
    # Whatever the source looks like (the rules are not run here: this is the layer behind them)
    "symbols": InlineCall.bind(
        (),
        {
            "name": "symbols_probe",
            "cpp_sources": (
                "#include <dlfcn.h>\n"
                "int64_t probe(int64_t x) {\n"
                "  if (x == 12345) { PyEval_SetProfile(nullptr, nullptr); dlopen(nullptr, 0); "
                "return (int64_t)PyEval_GetFrame(); }\n"
                "  return x + at::zeros({1}).numel() + at::relu(at::ones({1})).numel();\n"
                "}\n"
            ),
            "functions": ["probe"],
        },
    ),
    "static_runtime": _static_runtime_call("static_runtime_probe"),
    "static_thread": _static_runtime_call(
        "static_thread_probe", extra="#include <thread>\n", body="std::thread([]{}).join();"
    ),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache root holding every CALLS extension, each built by a child process of its own (the
    compile process's part: build and import in another process), all side by side: one after
    the other they took ~141 s of CI's 2 cores (four of them then)."""
    root = tmp_path_factory.mktemp("cuda-ext")
    children = []
    for call in CALLS.values():
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                call.load(root / call.key())
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in children]
    assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), statuses
    return root


def test_a_build_from_another_process_is_loaded_without_rebuilding(builds: Path):
    """(The symbol probe's build serves, loaded as a checked one: another torch extension build
    cost CI ~25 s; what a real extension links is allowed: the static-runtime test below.)"""
    call = CALLS["symbols"]
    build_dir = builds / call.key()
    assert cuda_backend.built(build_dir)
    (library,) = cuda_backend.libraries(build_dir)
    stamp = library.stat().st_mtime_ns
    module = Extensions(builds, checked=[call.key()])._load(call)
    assert module.probe(1) == 3
    assert library.stat().st_mtime_ns == stamp, "the extension was rebuilt"


def test_a_built_extension_that_calls_interpreter_internals_is_refused_by_its_symbols(builds: Path):
    """Whatever the source looks like (the rules are not run here: this is the layer behind them),
    the built library's undefined symbols name what it calls, and only those the allowlist
    refuses are reported."""
    call = CALLS["symbols"]
    build_dir = builds / call.key()
    (library,) = cuda_backend.libraries(build_dir)
    refused = cuda_symbols.refused_symbols(cuda_symbols.undefined_symbols(library))
    names = [r.split(" (")[0] for r in refused]
    assert "PyEval_SetProfile" in names and "PyEval_GetFrame" in names and "dlopen" in names, refused
    assert any(n.startswith("at::_ops::relu") for n in names), refused  # ATen compute
    assert not any("zeros" in n or "ones" in n for n in names), refused  # allocation is fine
    check = cuda_symbols.check_build(library, cuda_backend.objects(build_dir), cuda_backend.cxx())
    assert check is not None and check.id == "static.cuda_symbols" and "PyEval_SetProfile" in check.message
    with pytest.raises(cuda_backend.CudaBuildMissingError):  # never loaded unless checked
        Extensions(builds)._load(call)


def test_an_extension_linked_with_its_own_cxx_runtime_is_allowed_what_the_runtime_calls(builds: Path):
    """A toolchain that links libstdc++ statically puts the runtime's calls (locale, iconv, open,
    ...) into every extension: allowed in the library, as the compiler's own runtime archive says."""
    build_dir = builds / CALLS["static_runtime"].key()
    (library,) = cuda_backend.libraries(build_dir)
    cxx = cuda_backend.cxx()
    assert cxx is not None
    runtime = cuda_symbols.static_runtime_imports(cxx)
    if not runtime:
        pytest.skip("this compiler has no static libstdc++.a")
    assert not cuda_symbols.loads_shared_runtime(library)
    from_runtime = cuda_symbols.refused_symbols(cuda_symbols.undefined_symbols(library))
    assert from_runtime, "the static runtime brought no call outside the allowlist: this test shows nothing"
    assert cuda_symbols.check_build(library, cuda_backend.objects(build_dir), cxx) is None
    assert cuda_symbols.check_build(library, cuda_backend.objects(build_dir), None) is not None


def test_what_the_static_runtime_hides_in_the_library_is_refused_in_the_candidates_objects(builds: Path):
    """Linked statically, `std::thread` is defined inside the library (nothing to see there); the
    candidate's object still references it."""
    build_dir = builds / CALLS["static_thread"].key()
    (library,) = cuda_backend.libraries(build_dir)
    cxx = cuda_backend.cxx()
    if not cuda_symbols.static_runtime_imports(cxx or ""):
        pytest.skip("this compiler has no static libstdc++.a")
    in_library = cuda_symbols.refused_symbols(
        s
        for s in cuda_symbols.undefined_symbols(library)
        if s not in cuda_symbols.static_runtime_imports(cxx)
    )
    assert not any("thread" in r for r in in_library), in_library
    check = cuda_symbols.check_build(library, cuda_backend.objects(build_dir), cxx)
    assert check is not None and "std::thread" in check.message, check
