"""Static rules of the CUDA backend (eval_server/checks/cuda_static.py): kernel names, the C++ source
rules, and the Python rule set for backend "cuda"."""

from __future__ import annotations

import ast
import shutil

import pytest

from eval_server import samples
from eval_server.checks.cuda_static import (
    CUDA_RULES,
    SOURCE_RULES,
    expand_macros,
    kernel_names,
    namespaces,
    source_checks,
)
from eval_server.checks.static import run_static_checks

pytestmark = pytest.mark.unit

HONEST = samples.load_candidate("relu__cuda_correct")


def _ids(source: str) -> list[str]:
    return [c.id for c in source_checks(source)]


def test_kernel_names_cover_the_usual_spellings_and_skip_comments():
    src = """
    __global__ void plain(float* x) {}
    template <typename T> __global__ void templated(T* x) {}
    extern "C" __global__ void __launch_bounds__(256) bounded(float* x) {}
    __global__ static void stat(float* x) {}
    // __global__ void commented(float* x) {}
    /* __global__ void blocked(float* x) {} */
    __device__ void helper(float* x) {}
    """
    assert kernel_names(src) == ["plain", "templated", "bounded", "stat"]
    assert namespaces("namespace fast { __global__ void k() {} }") == {"fast"}


def test_the_honest_sample_fires_nothing():
    assert run_static_checks(ast.parse(HONEST), CUDA_RULES) == []
    assert source_checks(HONEST) == []


@pytest.mark.parametrize(
    "snippet, rule",
    [
        ("return at::relu(x);", "static.cuda_torch_compute"),
        ("return torch::matmul(a, b);", "static.cuda_torch_compute"),
        ("return torch::nn::functional::softmax(x, 1);", "static.cuda_torch_compute"),
        ("return a.matmul(b);", "static.cuda_torch_compute"),
        ("#include <cublas_v2.h>", "static.cuda_library"),
        (
            "cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &a, b, n, c, k, &z, d, n);",
            "static.cuda_library",
        ),
        ("thrust::sort(thrust::device, p, p + n);", "static.cuda_library"),
        ("cub::DeviceReduce::Sum(t, b, in, out, n);", "static.cuda_library"),
        ("std::thread t([] {});", "static.cuda_process_escape"),
        ("cudaStream_t s; cudaStreamCreateWithFlags(&s, 1);", "static.cuda_process_escape"),
        ("auto s = at::cuda::getStreamFromPool();", "static.cuda_process_escape"),
        ("cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);", "static.cuda_process_escape"),
        ('system("ls");', "static.cuda_process_escape"),
        ('auto gc = py::module_::import("gc");', "static.cuda_host_escape"),
        ('void* h = dlopen("libc.so.6", 1);', "static.cuda_host_escape"),
        ("c10::cuda::CUDACachingAllocator::emptyCache();", "static.cuda_host_escape"),
        ("attr.accessPolicyWindow.num_bytes = n;", "static.cuda_host_escape"),
        ('asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));', "static.cuda_inline_asm"),
        ('asm("st.f32 [%0], %1;" :: "l"(p), "f"(v));', "static.cuda_inline_asm"),
        (
            'asm volatile("atom.global.add.f32 %0, [%1], %2;" : "=f"(o) : "l"(p), "f"(v));',
            "static.cuda_inline_asm",
        ),
        ('asm volatile("syscall" : "=a"(r) : "a"(nr), "D"(a) : "rcx", "r11", "memory");', "static.cuda_inline_asm"),
        ('__asm__ __volatile__("int $0x80" : "=a"(r) : "a"(37));', "static.cuda_inline_asm"),
        ('asm volatile("mov x8, %1\n svc #0" : "=r"(r) : "r"(nr));', "static.cuda_inline_asm"),
    ],
)
def test_each_source_rule_fires_with_evidence(snippet: str, rule: str):
    checks = source_checks(snippet)
    assert [c.id for c in checks] == [rule]
    assert "Found:" in checks[0].message and checks[0].severity == "reject"


@pytest.mark.parametrize(
    "snippet",
    [
        'asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));',
        'asm volatile("st.shared::cta.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(a), "f"(x), "f"(y), "f"(z), "f"(w));',
        'asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(g));',
        'asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0}, {%1}, {%2}, {%3};" : "=f"(d) : "r"(a), "r"(b), "f"(c));',
        "// cudaStreamCreate(&s); at::relu(x) in a comment\nauto out = torch::empty_like(x);",
        "int m = std::max(a, b); float v = fmaxf(x, 0.f); auto o = torch::zeros({n}, x.options());",
        "namespace at_helpers { __global__ void k() {} }",
        'asm volatile("fence.acq_rel.sys;" ::: "memory"); asm volatile("membar.sys;");',
    ],
)
def test_legitimate_code_fires_nothing(snippet: str):
    assert _ids(snippet) == []


def test_rule_messages_say_what_to_do_instead():
    for rule_id, (message, _) in SOURCE_RULES.items():
        assert rule_id.startswith("static.cuda_") and len(message) > 80, rule_id


def test_python_rules_swap_the_triton_rule_for_load_inline():
    ids = {r.id for r in CUDA_RULES}
    assert "static.no_triton_kernel" not in ids
    assert {
        "static.no_cuda_kernel",
        "static.cuda_build_api",
        "static.torch_compute",
        "static.try_except",
    } <= ids
    triton = run_static_checks(ast.parse(samples.load_candidate("relu__correct")), CUDA_RULES)
    assert [c.id for c in triton] == ["static.no_cuda_kernel"]


def test_only_load_inline_may_build_native_code():
    src = HONEST.replace(
        "from torch.utils.cpp_extension import load_inline",
        "from torch.utils.cpp_extension import load_inline\nimport torch.utils.cpp_extension as ce\n"
        "ce.load(name='x', sources=['x.cu'])\ntorch.ops.load_library('x.so')",
    )
    checks = run_static_checks(ast.parse(src), CUDA_RULES)
    build = [c for c in checks if c.id == "static.cuda_build_api"]
    assert (
        build and "torch.utils.cpp_extension.load" in build[0].message and "load_library" in build[0].message
    )


def test_source_rules_read_string_constants_in_the_static_phase():
    src = HONEST.replace("auto out = torch::empty_like(xc);", "auto out = at::relu(xc);")
    assert [c.id for c in run_static_checks(ast.parse(src), CUDA_RULES)] == ["static.cuda_torch_compute"]


PASTED = [
    # a name assembled by token pasting in the source's own macro
    (
        "#define CAT(a, b) a##b\nvoid f() { cudaStream_t s; CAT(cuda, StreamCreate)(&s); }",
        "static.cuda_process_escape",
    ),
    # nested macros, the paste one level down
    (
        "#define J(a, b) a##b\n#define MK(x) J(cuda, x)\nvoid f() { MK(LaunchHostFunc)(0, 0, 0); }",
        "static.cuda_process_escape",
    ),
    # defined only in nvcc's device pass
    (
        "#ifdef __CUDA_ARCH__\n#define P(a, b) a##b\n#endif\nvoid f() { P(dl, open)(0, 0); }",
        "static.cuda_host_escape",
    ),
    # defined only in the host pass (nvcc defines __CUDACC__ there, not __CUDA_ARCH__)
    (
        "#if defined(__CUDACC__) && !defined(__CUDA_ARCH__)\n#define P(a, b) a##b\n#endif\n"
        "void f() { P(cublas, Sgemm)(h); }",
        "static.cuda_library",
    ),
    # an object-like macro hiding a library call
    ("#define GEMM cublasSgemm\nvoid f() { GEMM (h, 0); }", "static.cuda_library"),
]


@pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor (cpp) installed")
@pytest.mark.parametrize(("snippet", "rule"), PASTED)
def test_names_assembled_by_the_sources_own_macros_are_judged(snippet: str, rule: str):
    assert rule not in _ids(snippet.replace("#", "//#"))  # the text alone does not show it
    assert rule in _ids(snippet)


@pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor (cpp) installed")
def test_macro_expansion_keeps_the_honest_sample_clean_and_drops_includes():
    assert _ids(HONEST) == []
    expanded = expand_macros("#include <cuda_runtime.h>\n#define N 4\nint a[N];")
    assert expanded and all("cudaStreamCreate" not in e and "int a[4];" in e for e in expanded)
