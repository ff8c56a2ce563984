"""What a built CUDA extension links against, held to an allowlist.

The source rules (cuda_static.py) read what the C++ says; the dynamic symbols the built
extension leaves undefined say what it *calls* outside itself, however the source spelled it
(macros, token pasting, templates, headers): `nm -D --undefined-only` lists every function the
dynamic loader must find in torch, pybind11, CPython, the CUDA runtime or libc. A load_inline
extension needs a small, known set of those; everything else is refused before the extension is
loaded (its constructors are native code: the check runs before `dlopen`, in the evaluation
process, on the file the compile process built).

Allowed: C++ symbols of c10 / ATen / torch / pybind11 / the C++ runtime (except the entries below),
the CPython C API (except frames, tracing, profiling, thread states, the garbage collector, audit
hooks and running code from strings or marshalled data; pybind11's own error formatting needs
`PyFrame_GetBack`, `PyFrame_GetCode` and `PyFrame_GetLineNumber` on traceback frames, so those
three are allowed, and generic attribute access cannot be refused by symbol at all: the threat
model says what stands there), the CUDA runtime (except stream, graph and driver-entry-point creation, callbacks,
device limits and persisting-L2 attributes), the registration stubs nvcc emits, and the libc and
libm functions host code uses (memory, strings, printing, math, mutexes, errno, thread-local keys).
Refused: everything else, and within the allowed families: ATen operators that compute (only
the allocation, view and copy operators of runtime.ALLOWED_ATEN_OPS are allowed), ATen's BLAS and
vendor-library handles (cuBLAS, cuDNN, ...), streams from the pool or from outside, `std::thread`.
Native code can still do anything it can reach without a symbol (raw system calls, inline
assembly, computed addresses): that is what the process sandbox is for (docs/EVAL_SERVER.md,
threat model).

Two files are read, because some toolchains link the C++ runtime into every extension
(`-static-libstdc++`: the GCC in /opt/gcc of the lent GPU machines does): the runtime's own calls
(locale, iconv, `open`, `syscall`, `pthread_create`, ...) then appear in the library, and the
candidate's uses of the runtime (`std::thread`) disappear from it. So the candidate's own objects
(the `.o` files of its translation units, every external reference they make) are held to the
allowlist, and the library that is loaded to the allowlist plus what the toolchain's static C++
runtime calls outside itself, when the library does not load the shared runtime.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from eval_server.checks.runtime import ALLOWED_ATEN_OPS
from eval_server.schema import Check

CHECK_ID = "static.cuda_symbols"

# Inside the allowed families: refused first (demangled names).
_REFUSED = re.compile(
    r"""^(?:
        _?Py(?:Eval_(?:Set|Get)(?:Trace|Profile|Frame|Locals|Globals)\w*|Frame_(?!GetBack$|GetCode$|GetLineNumber$)\w*|ThreadState_(?:GetFrame|Next|SetAsyncExc)\w*
            |InterpreterState_(?:ThreadHead|Next|Head)\w*|GC_\w*|Unstable_GC_\w*|Sys_AddAuditHook|Monitoring_\w*|Gen_GetCode
            |Run_\w*|_CompileString\w*|Eval_EvalCode\w*|Import_ExecCode\w*|Marshal_\w*|Code_New\w*|Unstable_Code\w*)
        |_PyFrame\w*|_PyThreadState_GetFrame\w*|_PyEval_(?:SetTrace|SetProfile|GetFrame)\w*
        |cuda(?:StreamCreate|StreamBeginCapture|Graph|GetDriverEntryPoint|StreamSetAttribute|DeviceSetLimit
            |CtxResetPersistingL2Cache|LaunchHostFunc|StreamAddCallback|ThreadSetLimit|DeviceSetCacheConfig)\w*
        |cu(?:StreamCreate|Graph|GetProcAddress|StreamSetAttribute|CtxSetLimit|LaunchHostFunc)\w*
    )$""",
    re.VERBOSE,
)
_REFUSED_CPP = re.compile(
    r"getStreamFromPool|getStreamFromExternal|setCurrentCUDAStream|CUDABlas|CUDASolver|CUDASparse|Cudnn|cudnn"
    r"|cublas|cusparse|cusolver|cufft|nccl|at::cuda::blas|at::native::|std::thread::"
)
_OPS = re.compile(r"^at::_ops::(\w+?)::")

_CPP_FAMILIES = (
    "c10::", "at::", "torch::", "caffe2::", "pybind11::", "std::", "__gnu_cxx::", "operator new", "operator delete",
    "typeinfo for ", "vtable for ", "VTT for ", "THP",
)  # fmt: skip
_C_PREFIXES = ("Py", "_Py", "cuda", "__cuda", "__cxa_", "_Unwind_", "__gxx_personality", "_ITM_", "THP")
_LIBC = frozenset(
    ["memcpy", "memmove", "memset", "memcmp", "memchr", "strlen", "strnlen", "strcmp", "strncmp", "strcpy", "strncpy", "strcat", "strchr", "strrchr", "strstr", "strdup", "strtol", "strtoul", "strtoll", "strtoull", "strtod", "strtof", "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "abort", "printf", "fprintf", "sprintf", "snprintf", "vsnprintf", "vfprintf", "puts", "fputs", "fputc", "putchar", "fwrite", "fflush", "stderr", "stdout", "__printf_chk", "__fprintf_chk", "__sprintf_chk", "__snprintf_chk", "__vsnprintf_chk", "__vfprintf_chk", "__memcpy_chk", "__memmove_chk", "__memset_chk", "__strcpy_chk", "__strcat_chk", "__stack_chk_fail", "__assert_fail", "__errno_location", "__tls_get_addr", "__gmon_start__", "__dso_handle", "__cxa_finalize", "pthread_once", "pthread_mutex_lock", "pthread_mutex_unlock", "pthread_key_create", "pthread_key_delete", "pthread_getspecific", "pthread_setspecific", "pthread_self", "__pthread_key_create", "getenv", "__dynamic_cast", "__libc_single_threaded", "__once_proxy", "__once_callable", "__once_call", "atexit", "_GLOBAL_OFFSET_TABLE_", "__isoc23_strtol", "__isoc23_strtoul", "__isoc23_strtoll", "__isoc23_strtoull"]
)  # fmt: skip
_LIBM = re.compile(
    r"^(?:sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|erf|erfc"
    r"|fabs|floor|ceil|round|lround|trunc|fmod|fmax|fmin|frexp|ldexp|modf|hypot|lgamma|tgamma|nearbyint|rint)[fl]?$"
)


_NM_LINE = re.compile(r"^([0-9a-fA-F]*)\s+(\S) (.+)$")


def _nm(path: Path, *flags: str) -> list[tuple[bool, str]]:
    """(defined here, demangled name without version suffix) of each symbol `nm` lists."""
    nm = shutil.which("nm")
    if nm is None:
        raise FileNotFoundError("nm (binutils) is needed to check a built extension's symbols")
    out = subprocess.run(
        [nm, *flags, "-C", str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return [
        (bool(m.group(1)), m.group(3).split("@", 1)[0].strip())
        for m in map(_NM_LINE.match, out.stdout.splitlines())
        if m
    ]


def undefined_symbols(path: Path) -> list[str]:
    """The undefined symbols of a shared library (its dynamic ones) or of an object file."""
    dynamic = ["-D"] if path.suffix == ".so" else []
    return [name for _, name in _nm(path, *dynamic, "--undefined-only")]


@functools.lru_cache(maxsize=4)
def static_runtime_imports(cxx: str) -> frozenset[str]:
    """What the C++ compiler's static runtime (its libstdc++.a) calls outside itself: the symbols
    a toolchain that links the runtime into an extension leaves undefined in it."""
    found = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True, timeout=60)
    archive = Path(found.stdout.strip())
    if found.returncode != 0 or not archive.is_absolute() or not archive.is_file():
        return frozenset()
    symbols = _nm(archive)
    defined = {name for here, name in symbols if here}
    return frozenset(name for here, name in symbols if not here and name not in defined)


def loads_shared_runtime(library: Path) -> bool:
    """Whether `library` loads the shared C++ runtime (libstdc++.so / libc++.so) rather than
    carrying its own copy."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise FileNotFoundError("readelf (binutils) is needed to check a built extension's symbols")
    out = subprocess.run(
        [readelf, "-d", str(library)], capture_output=True, text=True, timeout=60, check=True
    )
    return bool(re.search(r"\(NEEDED\).*\[lib(?:stdc|c)\+\+\.so", out.stdout))


def _qualified_name(symbol: str) -> str:
    """The function's qualified name in a demangled symbol: template arguments and a template's
    return type dropped (`float* at::TensorBase::data_ptr<float>() const` -> `at::TensorBase::data_ptr`)."""
    if "operator" in symbol and not symbol.startswith("operator"):  # `ret ns::operator<< <T>(...)`
        return _qualified_name(symbol.split("operator", 1)[0]).rstrip(":") + "::operator"
    depth, kept = 0, []
    for ch in symbol:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif not depth:
            kept.append(ch)
    head = "".join(kept)
    if head.startswith(("operator", "typeinfo for ", "vtable for ", "VTT for ")):
        return head
    return head.split("(", 1)[0].strip().split(" ")[-1]


def why_refused(symbol: str) -> str | None:
    """Why an extension may not call `symbol` (None: allowed)."""
    name = _qualified_name(symbol)
    if _REFUSED.match(name) or _REFUSED_CPP.search(symbol):
        return "refused"
    op = _OPS.match(name)
    if op:
        name = op.group(1)
        allowed = name in ALLOWED_ATEN_OPS or any(name.startswith(a + "_") for a in ALLOWED_ATEN_OPS)
        return None if allowed else "an ATen operator that computes"
    if name.startswith(_CPP_FAMILIES) or name.startswith(_C_PREFIXES):
        return None
    if name in _LIBC or _LIBM.match(name):
        return None
    return "not on the allowlist"


def refused_symbols(symbols: Iterable[str]) -> list[str]:
    """`symbol (why)` for every refused symbol, sorted."""
    return sorted({f"{s} ({why})" for s in symbols if (why := why_refused(s)) is not None})


def _refused_in_objects(objects: Iterable[Path]) -> set[str]:
    symbols = [entry for obj in objects for entry in _nm(obj)]
    defined = {name for here, name in symbols if here}  # one object calls another's function
    return set(refused_symbols(name for here, name in symbols if not here and name not in defined))


def check_build(library: Path, objects: Iterable[Path], cxx: str | None) -> Check | None:
    """A rejecting Check naming the refused symbols of a build (its library, and the candidate's
    objects it was linked from), or None. `cxx` is the compiler that linked it."""
    refused = _refused_in_objects(objects)
    runtime = frozenset() if cxx is None or loads_shared_runtime(library) else static_runtime_imports(cxx)
    refused.update(refused_symbols(s for s in undefined_symbols(library) if s not in runtime))
    return _rejection(refused)


def _rejection(refused: set[str]) -> Check | None:
    if not refused:
        return None
    ordered = sorted(refused)
    shown = "; ".join(ordered[:8]) + (f"; and {len(ordered) - 8} more" if len(ordered) > 8 else "")
    return Check(
        CHECK_ID,
        "Your built extension calls functions outside what a kernel extension may use (torch/ATen "
        "allocation and views, pybind11, the CUDA runtime's memory and launch API, libc): "
        f"{shown}. Compute in your own __global__ kernels on the current stream; no CPython "
        "internals, vendor libraries, other streams, threads, processes or dynamic loading.",
    )
