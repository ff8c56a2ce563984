"""The CUDA backend's pieces that need no compiler (eval_server/pipeline/cuda_backend.py): load_inline call
keys, the generated sources and the line mapping of compiler errors, kernel ownership for the
profiler check, and the compile process's verdicts without a toolchain. Compiling with nvcc is
exercised by tests/integration/test_eval_cuda_cpu.py (skipped without nvcc) and on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import samples
from eval_server.pipeline import cuda_backend
from eval_server.pipeline.cuda_backend import Extensions, InlineCall, generated_sources, trim_compiler_output

pytestmark = pytest.mark.unit

CUDA = "\n__global__ void relu_kernel(const float* x, float* y, int64_t n) {\n  int64_t i = 0;\n}\n"


def _call(**kwargs) -> InlineCall:
    args = {"name": "ext", "cpp_sources": "torch::Tensor f(torch::Tensor x);", "cuda_sources": CUDA}
    args.update(kwargs)
    return InlineCall.bind((), {**args, "functions": ["f"]})


def test_call_key_follows_sources_and_options_not_the_build_directory():
    base = _call()
    assert base.cpp_sources == ("torch::Tensor f(torch::Tensor x);",) and base.cuda_sources == (CUDA,)
    assert base.key() == _call().key() == _call(build_directory="/elsewhere", verbose=True).key()
    assert base.key() != _call(cuda_sources=CUDA + " ").key()
    assert base.key() != _call(extra_cuda_cflags=["-O3"]).key()
    assert base.key() != _call(name="other").key()
    positional = InlineCall.bind(("ext", "torch::Tensor f(torch::Tensor x);", CUDA), {"functions": ["f"]})
    assert positional.key() == base.key()


def test_generated_sources_put_the_candidate_after_the_implicit_headers():
    files = generated_sources(_call())
    headers = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    assert files["cuda.cu"] == "\n".join([*headers, CUDA])
    main = files["main.cpp"].splitlines()
    assert main[0] == "#include <torch/extension.h>" and main[1] == "torch::Tensor f(torch::Tensor x);"
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in main
    bare = generated_sources(_call(no_implicit_headers=True))
    assert bare["cuda.cu"] == CUDA


def test_compiler_errors_are_trimmed_and_mapped_to_the_candidate_lines():
    build = "/tmp/cache/abc"
    log = (
        "[1/3] nvcc ... -c /tmp/cache/abc/cuda.cu -o cuda.cuda.o\nFAILED: cuda.cuda.o\n"
        "/tmp/x/site-packages/torch/include/c10/core/AutogradState.h(90): warning #3306-D: c++20\n"
        '/tmp/cache/abc/cuda.cu(7): error: identifier "y2" is undefined\n'
        "      y2[i] = 0;\n      ^\n\n"
        '1 error detected in the compilation of "/tmp/cache/abc/cuda.cu".\n'
        "/tmp/cache/abc/main.cpp:2:1: error: 'foo' does not name a type\n"
        "    2 | foo f(torch::Tensor x);\n      | ^~~\n"
        "/tmp/cache/abc/main.cpp:4:17: error: 'f' was not declared in this scope\n"
    )
    text = trim_compiler_output(log, _call(), build)
    assert 'cuda.cu(7): error: identifier "y2" is undefined [line 4 of your cuda_sources]' in text
    assert "      y2[i] = 0;" in text and "/tmp/cache" not in text and "warning" not in text
    assert "main.cpp:2:1: error: 'foo' does not name a type [line 1 of your cpp_sources]" in text
    assert "[in the PYBIND11_MODULE that load_inline generates for your `functions`]" in text
    assert (
        trim_compiler_output("ninja: build stopped\nsomething odd") == "ninja: build stopped\nsomething odd"
    )


def _extensions(*cuda_sources: str) -> Extensions:
    ext = Extensions(Path("unused"))  # not installed: load_inline stays torch's own
    ext.calls = [_call(name=f"e{i}", cuda_sources=s) for i, s in enumerate(cuda_sources)]
    return ext


def test_kernel_ownership_reads_cupti_names():
    ext = _extensions(
        "__global__ void relu_kernel(float* x) {}\n"
        "template <int B> __global__ void tiled(float* x) {}\n"
        "namespace mine { __global__ void inner(float* x) {} }\n"
        "namespace at { __global__ void vectorized_elementwise_kernel(float* x) {} }",
        'extern "C" __global__ void plain_c(float* x) {}',
    )
    assert ext.kernels == {"relu_kernel", "tiled", "inner", "vectorized_elementwise_kernel", "plain_c"}
    for own in (
        "relu_kernel(float*)",
        "void tiled<128>(float*)",
        "mine::inner(float*)",
        "(anonymous namespace)::relu_kernel(float*)",
        "plain_c",
    ):
        assert ext.owns(own), own
    for foreign in (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "launch_clamp_scalar(at::TensorIteratorBase&)>(int, float*)",
        "at::vectorized_elementwise_kernel(float*)",  # a library namespace, even if declared
        "ampere_sgemm_128x64_nn",
        "other::relu_kernel(float*)",
        "relu_kernel_v2(float*)",
    ):
        assert not ext.owns(foreign), foreign
    assert ext.count_own(["relu_kernel(float*)", "Memcpy DtoD (Device -> Device)", "plain_c"]) == 2


def test_without_a_toolchain_source_rules_still_run(monkeypatch, tmp_path: Path):
    """The compile process applies the source rules before asking for a compiler."""
    monkeypatch.setattr(cuda_backend, "nvcc_path", lambda: None)
    honest = cuda_backend.compile_candidate(
        samples.load_candidate("relu__cuda_correct"), tmp_path, tmp_path / "cache", 60, build=False
    )
    assert honest.unsupported == "no CUDA compiler (nvcc) on this worker"
    assert (honest.error, honest.checks, honest.calls, honest.compiled) == (None, [], 1, 0)
    assembled = samples.load_candidate("relu__cuda_correct").replace(
        'relu_cpp_source = "',
        'relu_cuda_source += "torch::Tensor g(torch::Tensor x) { return at::" + "relu(x); }"\n'
        'relu_cpp_source = "',
    )
    refused = cuda_backend.compile_candidate(assembled, tmp_path, tmp_path / "cache", 60, build=False)
    assert [c.id for c in refused.checks] == ["static.cuda_torch_compute"]
    broken = cuda_backend.compile_candidate(
        "raise ValueError('at import')\n", tmp_path, tmp_path / "c", 60, False
    )
    assert broken.import_error and "ValueError: at import" in broken.import_error


def test_compile_timeout_stops_the_compile_process(tmp_path: Path):
    slow = "import time\ntime.sleep(30)\n"
    report = cuda_backend.compile_candidate(slow, tmp_path, tmp_path / "cache", 0.5, build=False)
    assert report.error == "Compilation did not finish within 0.5 s and was stopped."


def test_cache_keeps_the_most_recently_used_builds(tmp_path: Path):
    import os

    for i in range(5):
        (tmp_path / f"b{i}").mkdir()
        os.utime(tmp_path / f"b{i}", (1000 + i, 1000 + i))
    cuda_backend.prune_cache(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b3", "b4"]


def test_only_finished_builds_are_loaded(tmp_path: Path):
    """The evaluation never compiles: a build the compile process did not finish is an error."""
    call = _call()
    ext = Extensions(tmp_path)
    with pytest.raises(cuda_backend.CudaBuildMissingError, match="Call load_inline at module level"):
        ext._load(call)
    build_dir = tmp_path / call.key()
    build_dir.mkdir()
    (build_dir / "ext.so").write_bytes(b"")
    (build_dir / "building").touch()  # left by a build killed at the timeout
    assert not cuda_backend.built(build_dir)
    with pytest.raises(cuda_backend.CudaBuildMissingError):
        ext._load(call)
    (build_dir / "building").unlink()
    assert cuda_backend.built(build_dir) and ext.calls == []
    with pytest.raises(cuda_backend.CudaBuildMissingError):  # built, but its symbols were not checked
        ext._load(call)


def test_the_worker_never_imports_cpp_extension() -> None:
    """Importing torch.utils.cpp_extension calls torch.cuda.is_available(), which marks the process
    as unsafe to fork: in the worker that forks every evaluation, each one then failed to start
    CUDA (H100, 2026-11-24). Only evaluation processes import it (cuda_backend.bind)."""
    import subprocess
    import sys

    code = (
        "import sys, eval_server.workers.worker, eval_server.pipeline.evaluate, eval_server.workers.pool\n"
        "print('torch.utils.cpp_extension' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
