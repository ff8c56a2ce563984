"""Static rules for the CUDA backend: the candidate's Python (KernelBench's CUDA format) and the
CUDA/C++ source it hands to `torch.utils.cpp_extension.load_inline`.

The Python rules of static_checks.py apply unchanged, except that the Triton-kernel rule becomes
"a load_inline call with a __global__ kernel". The source rules read C++ text with regular
expressions (comments removed); they run twice on the same rule ids: in the static phase on every
string constant of the candidate (what is visible before anything runs), and in the compile phase
on the exact sources load_inline received (cuda_backend.py), so sources assembled at run time
("cuda" + "StreamCreate") are judged too, before anything is compiled. Names assembled by the
source's own macros (token pasting: `#define CAT(a, b) a##b` ... `CAT(cuda, StreamCreate)`) are
judged after expansion: the rules read the text as written and as the C preprocessor expands it
(its `#include` lines dropped, once as nvcc's host pass and once as its device pass see it).

What the source rules cover (a first pass; the runtime checks of the pipeline are the backstop):
torch/ATen compute called from C++, vendor libraries (cuBLAS, cuDNN, cuFFT, ..., thrust, CUB
device-wide algorithms), threads/processes/extra streams/host callbacks/device-to-host copies,
reaching the evaluator from native code (embedded Python imports, dlopen, /proc, the driver's
memory API, the caching allocator, persisting-L2 windows), and inline PTX that accesses global or
generic memory (loads and stores on raw addresses hidden from the C++ compiler and from review:
use C++ pointer accesses or __ldg; shared-memory, cp.async, ldmatrix and mma PTX stay allowed).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from types import MappingProxyType

from eval_server.checks.source_ast import calls, canonical_name, dotted_name, import_aliases
from eval_server.checks.static import RULES, TORCH_COMPUTE_CALLS, Rule
from eval_server.schema import Check

_LOAD_INLINE = "torch.utils.cpp_extension.load_inline"

# ---------------------------------------------------------------------------- C++ source text


def strip_comments(text: str) -> str:
    """C/C++ source without // and /* */ comments (string literals are left alone, which is
    enough for rules that look for identifiers and calls)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", text)


_GLOBAL_FN = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+|inline\s+|__forceinline__\s+)*"
    r"void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)
_NAMESPACE = re.compile(r"\bnamespace\s+(\w+)\s*\{")


def kernel_names(source: str) -> list[str]:
    """Names of the __global__ functions defined or declared in `source` (in order, unique)."""
    return list(dict.fromkeys(_GLOBAL_FN.findall(strip_comments(source))))


def namespaces(source: str) -> set[str]:
    """Namespaces the source opens (`namespace foo {`)."""
    return set(_NAMESPACE.findall(strip_comments(source)))


# Aten math a C++ extension might call besides the nn-level ops of TORCH_COMPUTE_CALLS.
_ATEN_MATH = frozenset(
    {"clamp", "clamp_min", "clamp_max", "maximum", "minimum", "max", "min", "sum", "mean", "exp", "log",
     "add", "sub", "mul", "div", "pow", "sqrt", "rsqrt", "abs", "where", "var", "std", "prod", "argmax",
     "argmin", "sort", "topk", "amax", "amin", "addcmul", "addcdiv", "lerp", "erf", "tanh_", "relu_"}
)  # fmt: skip
_TORCH_FREE_CALL = re.compile(r"\b(?:torch|at)(?:::\w+)*::(\w+)\s*\(")
_TORCH_METHOD_CALL = re.compile(r"\.\s*(\w+)\s*\(")


def _find_cpp_torch_compute(src: str) -> list[str]:
    hits = [
        f"{m.group(0).rstrip('( ')}()"
        for m in _TORCH_FREE_CALL.finditer(src)
        if m.group(1) in TORCH_COMPUTE_CALLS | _ATEN_MATH
    ]
    hits += [
        f".{m.group(1)}()" for m in _TORCH_METHOD_CALL.finditer(src) if m.group(1) in TORCH_COMPUTE_CALLS
    ]
    return hits


def _patterns(*regexes: str) -> Callable[[str], list[str]]:
    compiled = [re.compile(r) for r in regexes]

    def find(src: str) -> list[str]:
        return [m.group(0).strip() for rx in compiled for m in rx.finditer(src)]

    return find


_find_cpp_library = _patterns(
    r"#\s*include\s*[<\"](?:cublas\w*|cudnn\w*|cufft\w*|cusparse\w*|cusolver\w*|curand\.h|nccl\w*)[^>\"]*[>\"]",
    r"#\s*include\s*[<\"]ATen/(?:cuda/CUDABlas|native/)[^>\"]*[>\"]",
    r"\b(?:cublas|cublasLt|cudnn|cufft|cusparse|cusolver|nccl)[A-Z]\w*\s*\(",
    r"\bat::cuda::blas::\w+",
    r"\bthrust::\w+",
    r"\bcub::Device\w+",
)
_find_cpp_process_escape = _patterns(
    r"\bstd::(?:thread|jthread|async)\b",
    r"\bpthread_create\b",
    r"#\s*pragma\s+omp\b",
    r"(?<![\w.])(?:fork|vfork|system|popen|execl|execlp|execle|execv|execvp|execvpe)\s*\(",
    r"\bcudaStreamCreate\w*",
    r"\bcuStreamCreate\w*",
    r"\bgetStreamFromPool\b",
    r"\bgetStreamFromExternal\b",
    r"\bcudaStreamPerThread\b",
    r"\bcudaLaunchHostFunc\b",
    r"\bcudaStreamAddCallback\b",
    r"\bcudaMemcpyDeviceToHost\b",
    r"\bcudaMemcpyDefault\b",
    r"\bcudaHostAlloc\b|\bcudaMallocHost\b|\bcudaMallocManaged\b",
)
_find_cpp_host_escape = _patterns(
    r"\b(?:py|pybind11)::module_?::import\b",
    r"\b(?:py|pybind11)::(?:eval|exec|eval_file|globals)\b",
    r"\bPy(?:Import|Run|Eval|Sys|Object_GetAttr|Dict_GetItem|GC)_?\w*\s*\(",
    r"\bdl(?:open|sym|mopen)\s*\(",
    r"/proc/",
    # descriptors, files and signals: the evaluation hands its result to the worker through a pipe
    r"(?<![\w.>])(?:::)?(?:write|pwrite|writev|close|dup[23]?|open|openat|creat|fopen|freopen|fdopen|fwrite|"
    r"fputs|ioctl|fcntl|kill)\s*\(",
    r"\bstd::(?:ofstream|fstream)\b",
    r"\b(?:mmap|mprotect|syscall|ptrace|process_vm_readv|process_vm_writev)\s*\(",
    r"\bCUDACachingAllocator\b",
    r"\bgetDeviceAllocator\b",
    r"\bMemPool\b",
    r"\bcuMem\w+",
    r"\bcudaIpc\w+",
    r"\bcu(?:da)?PointerGetAttributes?\b",
    r"\bcudaDeviceSetLimit\b|\bcudaLimitPersistingL2CacheSize\b|\baccessPolicyWindow\b",
    r"\bcuda(?:Stream|GraphKernelNode)SetAttribute\b",
)

_ASM_START = re.compile(r"\b(?:asm|__asm__|__asm)\s*(?:volatile|__volatile__)?\s*(?:goto\s*)?\(")
_PTX_MEMORY_OP = re.compile(r"\b(ld|st|atom|red|multimem)((?:\.[\w:]+)+)")
_SAFE_STATE_SPACES = ("shared", "local", "param", "const")


def _asm_bodies(src: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline-asm statement, up to its matching parenthesis."""
    bodies = []
    for m in _ASM_START.finditer(src):
        depth, i = 1, m.end()
        while i < len(src) and depth:
            depth += {"(": 1, ")": -1}.get(src[i], 0)
            i += 1
        bodies.append((src.count("\n", 0, m.start()) + 1, src[m.end() : i - 1]))
    return bodies


# CPU instructions that enter the kernel: never PTX, only host code calling the OS around every
# symbol the allowlist sees (x86-64 syscall/sysenter/int 0x80, AArch64 svc)
_HOST_SYSCALL = re.compile(r"(?<![\w.])(syscall|sysenter|int\s+\$?0x80|svc\s+#?0)\b")


def _find_cpp_inline_asm(src: str) -> list[str]:
    hits = []
    for line, body in _asm_bodies(src):
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', body))  # the PTX text only
        for op in _HOST_SYSCALL.finditer(template):
            hits.append(f"source line {line}: asm {op.group(0)} (a system call from host code)")
        for op in _PTX_MEMORY_OP.finditer(template):
            spaces = op.group(2).split(".")
            if not any(s.split("::")[0] in _SAFE_STATE_SPACES for s in spaces):
                hits.append(f"source line {line}: asm {op.group(0)}")
    return hits


# id -> (message, finder over comment-free C++ text)
SOURCE_RULES: Mapping[str, tuple[str, Callable[[str], list[str]]]] = MappingProxyType(
    {
        "static.cuda_torch_compute": (
            "The CUDA/C++ source calls torch/ATen compute (torch::/at:: math, tensor methods such as "
            ".matmul() or .relu()): torch would do the work, not your kernel. Use torch in C++ only to "
            "allocate outputs (torch::empty, empty_like) and compute everything in __global__ kernels.",
            _find_cpp_torch_compute,
        ),
        "static.cuda_library": (
            "The CUDA/C++ source uses a vendor library or library algorithm (cuBLAS, cuDNN, cuFFT, "
            "cuSPARSE, cuSOLVER, NCCL, ATen's BLAS, thrust, CUB device-wide algorithms): write the "
            "computation as your own __global__ kernels (CUB block/warp primitives inside them are fine).",
            _find_cpp_library,
        ),
        "static.cuda_process_escape": (
            "The CUDA/C++ source starts threads or processes, creates or selects other CUDA streams, "
            "registers host callbacks, or copies device memory to the host: all work must run in "
            "forward, on the current stream (launch with <<<grid, block, smem, "
            "at::cuda::getCurrentCUDAStream()>>> or the default stream), on the GPU.",
            _find_cpp_process_escape,
        ),
        "static.cuda_host_escape": (
            "The CUDA/C++ source reaches outside its kernels into the evaluator's process (embedded "
            "Python imports or eval, dlopen/dlsym, /proc, mmap/syscall, the CUDA driver memory API, "
            "the caching allocator or memory pools, persisting-L2 access windows). Kernels may only "
            "read their input tensors and write their outputs.",
            _find_cpp_host_escape,
        ),
        "static.cuda_inline_asm": (
            "Inline PTX that loads or stores global/generic memory is not allowed (it hides address "
            "arithmetic from the compiler and from review), nor inline assembly that makes system calls "
            "(syscall, int 0x80, svc). Access global memory through C++ pointers (or __ldg); PTX for "
            "shared memory, cp.async, ldmatrix, mma and arithmetic is fine.",
            _find_cpp_inline_asm,
        ),
    }
)


def source_checks(source: str) -> list[Check]:
    """Apply every source rule to CUDA/C++ text, as written and with its own macros expanded; one
    Check per fired rule, evidence cited."""
    texts = [strip_comments(source), *expand_macros(source)]
    found = (
        (rule_id, message, [hit for text in texts for hit in find(text)])
        for rule_id, (message, find) in SOURCE_RULES.items()
    )
    return [_check(rule_id, message, evidence) for rule_id, message, evidence in found if evidence]


_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define\b", re.M)
# What nvcc defines in its two passes over a .cu file (the host compiler's own macros, __GNUC__,
# __linux__ ..., come from cpp itself): a macro defined only under one of them is still expanded.
_PASSES = (
    ("-D__CUDACC__", "-D__NVCC__"),
    ("-D__CUDACC__", "-D__NVCC__", "-D__CUDA_ARCH__=900"),
)


def expand_macros(source: str) -> list[str]:
    """The source as the C preprocessor expands its own macros, once per nvcc pass. `#include`
    lines are dropped first (the headers' macros are the toolchain's, and the headers declare the
    very names the rules look for). Empty when no C preprocessor is installed; text the
    preprocessor still prints after an error (`#error`, a bad directive) is used as is. A source
    that defines no macro of its own is not run through it: expansion could only drop text then."""
    cpp = shutil.which("cpp")
    if cpp is None or not _DEFINE.search(source):
        return []
    own = _INCLUDE.sub("", source)
    out = []
    for defines in _PASSES:
        try:
            proc = subprocess.run(
                [cpp, "-P", "-w", "-x", "c++", *defines, "-"],
                input=own,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.stdout:
            out.append(strip_comments(proc.stdout))
    return out


def _check(rule_id: str, message: str, evidence: list[str]) -> Check:
    uniq = list(dict.fromkeys(evidence))
    shown = "; ".join(uniq[:5]) + (" ..." if len(uniq) > 5 else "")
    return Check(rule_id, f"{message} Found: {shown}.", "reject")


# ---------------------------------------------------------------------------- Python side


def _string_constants(tree: ast.Module) -> str:
    """Every string constant of the module (f-string parts included), one per line block."""
    return "\n".join(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _find_no_cuda_kernel(tree: ast.Module) -> list[str]:
    aliases = import_aliases(tree)
    builds = [name for _, name in calls(tree) if name and canonical_name(name, aliases) == _LOAD_INLINE]
    if not builds:
        return ["no call of torch.utils.cpp_extension.load_inline"]
    if not kernel_names(_string_constants(tree)):
        return ["no __global__ kernel in the source strings"]
    return []


def _find_build_api(tree: ast.Module) -> list[str]:
    """Native code may only come from load_inline: other build/load routes skip the compile phase."""
    aliases = import_aliases(tree)
    hits = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Attribute | ast.Name):
            dotted = dotted_name(node)
            if dotted:
                names.append(canonical_name(dotted, aliases))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if (
                (name.startswith("torch.utils.cpp_extension.") and name != _LOAD_INLINE)
                or name.endswith(("load_library", ".jiterator"))
                or ".jiterator." in name
            ):
                hits.append(f"line {getattr(node, 'lineno', 0)}: {name}")
    return sorted(set(hits))


def _find_source_rules(rule_id: str) -> Callable[[ast.Module], list[str]]:
    _, find = SOURCE_RULES[rule_id]
    return lambda tree: find(strip_comments(_string_constants(tree)))


CUDA_RULES: tuple[Rule, ...] = (
    Rule(
        "static.no_cuda_kernel",
        "The candidate must build its kernels with torch.utils.cpp_extension.load_inline at import "
        "(module level), from CUDA source that defines at least one __global__ kernel, and call them "
        "from ModelNew.forward.",
        "reject",
        _find_no_cuda_kernel,
    ),
    Rule(
        "static.cuda_build_api",
        "Native code may only be built with torch.utils.cpp_extension.load_inline (cuda_sources in the "
        "file): other cpp_extension entry points, torch.ops.load_library and jiterator are not allowed.",
        "reject",
        _find_build_api,
    ),
    *(r for r in RULES if r.id != "static.no_triton_kernel"),
    *(
        Rule(rule_id, message, "reject", _find_source_rules(rule_id))
        for rule_id, (message, _) in SOURCE_RULES.items()
    ),
)
