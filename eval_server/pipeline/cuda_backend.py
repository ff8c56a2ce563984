"""The CUDA backend: KernelBench-format candidates whose kernels are CUDA C++ built at import with
`torch.utils.cpp_extension.load_inline`.

Compilation is CPU work of seconds to a minute, so it must not hold the GPU's timing slot. The
evaluation process forks a *compile process* after the reference phase (outside the GPU lock, so
it overlaps another evaluation's timing) that imports the candidate with `load_inline` replaced:
each call's sources are checked (cuda_static.source_checks) and then built into
`<cache>/<key>/`, where the key hashes the sources, the build options and the toolchain. The
compile process cannot use the GPU (CUDA was initialised before the fork, and CUDA does not
survive one), holds no evaluator file descriptor, and is killed with its compiler processes at the
compile timeout. The evaluation process then imports the candidate itself with `load_inline`
pointed at the same directories, where torch finds the built .so (ninja has nothing to do) and
only loads it; a call whose sources were not built there fails instead of compiling under the
GPU lock. A resubmitted kernel reuses its directory: nothing is rebuilt.

Without a GPU (CPU workers) the compile process does not build an extension (the CPU build of
torch cannot link one): it compiles the generated sources with nvcc and the host compiler directly,
against torch's headers, so compile errors still reach the model; the evaluation then ends
`unsupported`. Compiler output is trimmed to the first errors, with line numbers mapped to the
candidate's own source strings.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import torch

from eval_server.checks.cuda_static import kernel_names, namespaces, source_checks
from eval_server.isolation import sandbox
from eval_server.pipeline import loader
from eval_server.schema import Check

# torch.utils.cpp_extension is imported only in an evaluation process, never in the worker that
# forks them: its import calls torch.cuda.is_available(), which marks the process as unsafe to fork
# and every forked evaluation then fails to initialise CUDA ("Cannot re-initialize CUDA in forked
# subprocess", seen on an H100). Bound by the first evaluation-side use (bind()), which comes
# before the candidate's import; kept in a dict so no module global is rebound after start-up.
_BOUND: dict[str, Any] = {}


def bind() -> ModuleType:
    """torch.utils.cpp_extension, with the real load_inline and its signature recorded the first
    time (before any candidate code in this process can replace them)."""
    import torch.utils.cpp_extension as cpp_extension

    if "load_inline" not in _BOUND:
        _BOUND["load_inline"] = cpp_extension.load_inline
        _BOUND["signature"] = inspect.signature(cpp_extension.load_inline)
    return cpp_extension


# Lines load_inline puts before the candidate's own sources (unless no_implicit_headers=True).
_IMPLICIT_CPP = ("#include <torch/extension.h>",)
_IMPLICIT_CUDA = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
MAX_CACHED_BUILDS = 32
_BUILDING = "building"  # marker file present while (or if) a build did not finish
_MAX_ERRORS = 5
# Kernels in these namespaces are never the candidate's own, whatever it declares.
_LIBRARY_NAMESPACES = frozenset(
    {"at", "c10", "torch", "caffe2", "cub", "thrust", "cutlass", "cute", "cublas", "cudnn", "std", "pybind11"}
)


class CudaBuildMissingError(RuntimeError):
    """load_inline was called with sources the compile phase did not build."""


class _Refused(BaseException):
    """Compile process: stop the import (a check fired or the build failed). BaseException so
    that no candidate `except Exception` can swallow it."""


# ---------------------------------------------------------------------------- one load_inline call


@dataclass(frozen=True)
class InlineCall:
    """One load_inline call, normalised: what it builds, and every argument for the build key."""

    name: str
    cpp_sources: tuple[str, ...]
    cuda_sources: tuple[str, ...]
    arguments: dict[str, Any]  # every bound argument, as passed

    @classmethod
    def bind(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InlineCall:
        bind()
        bound = _BOUND["signature"].bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        return cls(
            name=str(arguments["name"]),
            cpp_sources=_as_sources(arguments.get("cpp_sources")),
            cuda_sources=_as_sources(arguments.get("cuda_sources")),
            arguments=arguments,
        )

    def key(self) -> str:
        """Directory name of the build: sources, options and toolchain, hashed."""
        options = {
            k: repr(v) for k, v in sorted(self.arguments.items()) if k not in ("build_directory", "verbose")
        }
        payload = {
            "options": options,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
            "python": sys.version_info[:2],
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]

    @property
    def implicit_headers(self) -> bool:
        return not self.arguments.get("no_implicit_headers", False)

    def source_text(self) -> str:
        return "\n".join(self.cpp_sources + self.cuda_sources)

    def load(self, build_directory: Path) -> Any:
        """The real load_inline, building into (or loading from) `build_directory`."""
        build_directory.mkdir(parents=True, exist_ok=True)
        return _BOUND["load_inline"](
            **{**self.arguments, "build_directory": str(build_directory), "verbose": False}
        )


def _as_sources(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def install(handler: Callable[[InlineCall], Any]) -> None:
    """Replace torch.utils.cpp_extension.load_inline for the rest of this process (a disposable
    evaluation process): candidates that import it later get `handler` too."""

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        return handler(InlineCall.bind(args, kwargs))

    cpp_extension = bind()
    load_inline.__wrapped__ = _BOUND["load_inline"]  # type: ignore[attr-defined]
    cpp_extension.load_inline = load_inline


# ---------------------------------------------------------------------------- toolchain


def nvcc_path() -> str | None:
    """The CUDA compiler torch would use (CUDA_HOME), else CUDA_HOME/CUDA_PATH, else PATH."""
    homes = [bind().CUDA_HOME, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    for home in homes:
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def cxx() -> str | None:
    """The C++ compiler torch builds and links extensions with."""
    return shutil.which(os.environ.get("CXX", "c++"))


def toolchain_problem(build: bool) -> str | None:
    """Why this worker cannot compile CUDA candidates (None when it can)."""
    if nvcc_path() is None:
        return "no CUDA compiler (nvcc) on this worker"
    if cxx() is None:
        return "no C++ host compiler on this worker"
    if build and torch.version.cuda is None:
        return "this worker's torch is a CPU build: it cannot build CUDA extensions"
    if build and shutil.which("ninja") is None:
        return "ninja is not installed on this worker (torch builds extensions with it)"
    if build and not (shutil.which("nm") and shutil.which("readelf")):
        return "binutils (nm, readelf) is not installed on this worker (built extensions' symbols are checked with it)"
    return None


def prepare_gpu_build(device: torch.device) -> None:
    """Before forking the compile process on a GPU worker: initialise CUDA here (a forked process
    cannot use it then) and name the target architecture, which torch would otherwise ask the
    GPU for in the compile process. Architectures 9.0 and later get their `a` variant (wgmma, TMA)."""
    torch.cuda.init()
    if os.environ.get("TORCH_CUDA_ARCH_LIST", "") in ("", "native"):
        major, minor = torch.cuda.get_device_capability(device)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}{'a' if major >= 9 else ''}"


def _arch_flags() -> list[str]:
    """nvcc target for the compile check: the first TORCH_CUDA_ARCH_LIST entry, else sm_90."""
    first = (os.environ.get("TORCH_CUDA_ARCH_LIST") or "9.0").replace(";", " ").split()[0]
    m = re.match(r"(\d+)\.(\d+)([af]?)", first)
    arch = f"{m.group(1)}{m.group(2)}{m.group(3)}" if m else "90"
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


# ---------------------------------------------------------------------------- compiler output


_DIAGNOSTIC = re.compile(
    r"^(?P<file>[^\s:()]+?)(?:\((?P<eline>\d+)\)|:(?P<gline>\d+):\d+):\s*(?P<kind>error|fatal error|catastrophic error)"
)
_OTHER_ERROR = re.compile(r"^(ptxas (error|fatal)|nvlink error|.*undefined reference)|error:", re.IGNORECASE)
_NEW_ITEM = re.compile(r"^(\[\d+/\d+\]|FAILED:|ninja:|In file included|\S+\.(cu|cpp|h|cuh|hpp)[:(])")


def _source_note(file: str, line: int, call: InlineCall | None) -> str:
    """Where a line of the generated main.cpp / cuda.cu is in the candidate's own strings."""
    if call is None:
        return ""
    if file == "cuda.cu":
        own, implicit, what = call.cuda_sources, len(_IMPLICIT_CUDA), "cuda_sources"
    elif file == "main.cpp":
        own, implicit, what = call.cpp_sources, len(_IMPLICIT_CPP), "cpp_sources"
    else:
        return ""
    implicit = implicit if call.implicit_headers else 0
    n_own = "\n".join(own).count("\n") + 1 if own else 0
    if line <= implicit:
        return " [in the headers load_inline adds]"
    if line - implicit <= n_own:
        return f" [line {line - implicit} of your {what}]"
    return " [in the PYBIND11_MODULE that load_inline generates for your `functions`]"


def trim_compiler_output(output: str, call: InlineCall | None = None, build_dir: str | None = None) -> str:
    """The first errors of a build log with their source lines and carets, paths shortened, line
    numbers mapped to the candidate's strings; the log's tail when no error line is recognised."""
    if build_dir:
        output = output.replace(build_dir.rstrip(os.sep) + os.sep, "")
    output = re.sub(r"\S*?/site-packages/", "", output)
    lines = output.splitlines()
    blocks: list[str] = []
    i = 0
    while i < len(lines) and len(blocks) < _MAX_ERRORS:
        m = _DIAGNOSTIC.match(lines[i])
        if m or (_OTHER_ERROR.search(lines[i]) and "warning" not in lines[i].lower()):
            head = lines[i]
            if m:
                line = int(m.group("eline") or m.group("gline"))
                head += _source_note(os.path.basename(m.group("file")), line, call)
            block = [head]
            j = i + 1
            while j < len(lines) and len(block) < 4 and lines[j].strip() and not _NEW_ITEM.match(lines[j]):
                block.append(lines[j])
                j += 1
            blocks.append("\n".join(block))
            i = j
        else:
            i += 1
    total = sum(1 for ln in lines if _DIAGNOSTIC.match(ln))
    if not blocks:
        tail = [ln for ln in lines if ln.strip()][-30:]
        return "\n".join(tail)[-4000:]
    more = f"\n({total - len(blocks)} more errors not shown)" if total > len(blocks) else ""
    return ("\n\n".join(blocks) + more)[:6000]


# ---------------------------------------------------------------------------- compile check (no GPU)


_MISSING_HEADER = re.compile(
    r"fatal error: (\S+): No such file or directory|cannot open source file \"([^\"]+)\"", re.IGNORECASE
)


def generated_sources(call: InlineCall) -> dict[str, str]:
    """main.cpp and cuda.cu as load_inline writes them: implicit headers, then the candidate's
    sources, then (for `functions`) the pybind11 module that exports them."""
    cpp = list(call.cpp_sources)
    cuda = list(call.cuda_sources)
    if call.implicit_headers:
        cpp[:0] = _IMPLICIT_CPP
        cuda[:0] = _IMPLICIT_CUDA if cuda else ()
    functions = call.arguments.get("functions")
    if functions is not None:
        names = [functions] if isinstance(functions, str) else list(functions)
        wrap = call.arguments.get("with_pytorch_error_handling", True)
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        cpp += [
            f'm.def("{f}", {"torch::wrap_pybind_function(" + f + ")" if wrap else f}, "{f}");' for f in names
        ]
        cpp.append("}")
    files = {"main.cpp": "\n".join(cpp)}
    if cuda:
        files["cuda.cu"] = "\n".join(cuda)
    return files


# A CPU build of torch ships c10/cuda's headers but not the one its CMake generates for CUDA builds.
_CUDA_CMAKE_MACROS = (
    "c10/cuda/impl/cuda_cmake_macros.h",
    "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n",
)


def _shim_include(build_dir: Path) -> list[str]:
    """An include dir holding the generated c10/cuda header when this torch lacks it (CPU builds)."""
    rel, text = _CUDA_CMAKE_MACROS
    if any(os.path.exists(os.path.join(p, rel)) for p in bind().include_paths()):
        return []
    shim = build_dir / "shim"
    (shim / rel).parent.mkdir(parents=True, exist_ok=True)
    (shim / rel).write_text(text)
    return [str(shim)]


def _check_commands(call: InlineCall, files: dict[str, str], build_dir: Path) -> list[list[str]]:
    nvcc, compiler = nvcc_path(), cxx()
    assert nvcc is not None and compiler is not None
    cuda_include = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
    dirs = [*bind().include_paths(), *_shim_include(build_dir), sysconfig.get_paths()["include"]]
    includes = [f"-I{p}" for p in [*dirs, cuda_include]]
    includes += [f"-I{p}" for p in call.arguments.get("extra_include_paths") or []]
    defines = [f"-DTORCH_EXTENSION_NAME={call.name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    cflags = [str(f) for f in call.arguments.get("extra_cflags") or []]
    cuda_cflags = [str(f) for f in call.arguments.get("extra_cuda_cflags") or []]
    commands = [
        [compiler, "-fsyntax-only", "-w", "-std=c++20", "-fPIC", *includes, *defines, *cflags, "main.cpp"]
    ]
    if "cuda.cu" in files:
        commands.append(
            [nvcc, "-c", "cuda.cu", "-o", "cuda.o", "-w", "-std=c++20", *bind().COMMON_NVCC_FLAGS]
            + [*_arch_flags(), "-Xcompiler", "-fPIC", *includes, *defines, *cuda_cflags]
        )
    return commands


def check_compile(call: InlineCall, build_dir: Path) -> tuple[str | None, str | None]:
    """(compile error text, why the check is incomplete): compile the generated sources with nvcc
    and the host compiler, without linking (a CPU build of torch has no CUDA libraries to link).
    Results are cached in `build_dir` like builds are."""
    done = build_dir / "check.json"
    if done.exists():
        cached = json.loads(done.read_text())
        return cached["error"], cached["unsupported"]
    build_dir.mkdir(parents=True, exist_ok=True)
    files = generated_sources(call)
    for fname, text in files.items():
        (build_dir / fname).write_text(text)
    procs = [
        subprocess.Popen(cmd, cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in _check_commands(call, files, build_dir)
    ]
    outputs = [(p.communicate()[0], p.returncode) for p in procs]
    failed = "\n".join(out for out, rc in outputs if rc != 0)
    error = unsupported = None
    if failed:
        missing = _MISSING_HEADER.search(failed)
        if missing:
            unsupported = (
                f"the header {missing.group(1) or missing.group(2)} is not installed on this worker, so the "
                "compile check could not finish"
            )
        else:
            error = trim_compiler_output(failed, call, str(build_dir))
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps({"error": error, "unsupported": unsupported}))
    os.replace(tmp, done)
    return error, unsupported


# ---------------------------------------------------------------------------- the compile process


@dataclass
class BuildReport:
    """What the compile process found: checks that fired, a compile error, or why it could not
    judge; `compiled` counts the extensions built (or compile-checked) successfully."""

    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    unsupported: str | None = None
    compiled: int = 0
    calls: int = 0
    cached: int = 0  # builds found in the cache (not rebuilt)
    keys: list[str] = field(default_factory=list)  # build directories of the extensions built (or found)
    import_error: str | None = None  # the import failed for another reason (traceback tail)


def prune_cache(cache_root: Path, keep: int = MAX_CACHED_BUILDS) -> None:
    """Remove the least recently used build directories beyond `keep`."""
    if not cache_root.is_dir():
        return
    entries = sorted((p for p in cache_root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in entries[: max(0, len(entries) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def compile_candidate(
    source: str, workdir: Path, cache_root: Path, timeout_s: float, build: bool
) -> BuildReport:
    """Run the candidate's load_inline calls in a forked compile process (see the module
    docstring): `build` builds extensions (GPU workers), otherwise the sources are only compiled."""
    bind()  # the real load_inline, before the compile process imports the candidate
    problem = toolchain_problem(build)
    cache_root.mkdir(parents=True, exist_ok=True)
    prune_cache(cache_root)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # never returns
        os.close(read_fd)
        _compile_process(source, workdir, cache_root, build, problem, write_fd)
    os.close(write_fd)
    payload, timed_out = _read_until(read_fd, time.monotonic() + timeout_s)
    sandbox.kill_tree(pid)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    if timed_out:
        return BuildReport(error=f"Compilation did not finish within {timeout_s:g} s and was stopped.")
    if not payload:
        return BuildReport()  # the compile process died: the evaluation's own import shows why
    data = json.loads(payload)
    data["checks"] = [Check(**c) for c in data["checks"]]
    return BuildReport(**data)


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to `fd` until EOF, or (partial, True) at the deadline."""
    chunks = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), True
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    return b"".join(chunks), False
                chunks.append(data)
    finally:
        os.close(fd)


def _compile_process(
    source: str, workdir: Path, cache_root: Path, build: bool, problem: str | None, write_fd: int
) -> NoReturn:
    """The forked compile process: import the candidate with load_inline replaced, report, exit.
    Without a toolchain (`problem`) the source rules still run; the report says why nothing was
    compiled."""
    report = BuildReport()
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.closerange(3, write_fd)  # the evaluator's pipes, lock and log files are not the candidate's
        os.closerange(write_fd + 1, 1 << 16)
        install(lambda call: _compile_one(call, cache_root, build, problem, report))
        try:
            loader.import_source(source, workdir, "candidate")
        except _Refused:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported; a GPU evaluation reproduces it
            report.import_error = loader.format_exception_tail(exc, workdir)
        else:
            if report.calls == 0:
                report.checks.append(
                    Check(
                        "static.no_cuda_kernel",
                        "load_inline was not called while the module was imported: build the extension "
                        "at module level (as in KernelBench's CUDA format), not in __init__ or forward.",
                    )
                )
    finally:
        payload = json.dumps({**report.__dict__, "checks": [c.__dict__ for c in report.checks]}).encode()
        with contextlib.suppress(OSError):
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view) :]
        os._exit(0)


def _compile_one(
    call: InlineCall, cache_root: Path, build: bool, problem: str | None, report: BuildReport
) -> Any:
    report.calls += 1
    checks = source_checks(call.source_text())
    if not any(kernel_names(s) for s in call.cuda_sources):
        checks.append(
            Check(
                "static.no_cuda_kernel",
                f"load_inline(name={call.name!r}) got no CUDA source with a __global__ kernel: pass your "
                "kernels in cuda_sources.",
            )
        )
    if checks:
        report.checks += checks
        raise _Refused
    if problem is not None:
        report.unsupported = problem
        raise _Refused
    build_dir = cache_root / call.key()
    if not build:
        error, unsupported = check_compile(call, build_dir)
        report.error, report.unsupported = error, unsupported
        if error or unsupported:
            raise _Refused
        report.compiled += 1
        return types.SimpleNamespace()  # stands for the module: nothing runs in this process
    marker = build_dir / _BUILDING
    if marker.exists():  # a build killed at the timeout: its lock file and partial outputs go too
        shutil.rmtree(build_dir, ignore_errors=True)
    report.cached += built(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    os.utime(build_dir)  # most recently used: pruned last
    marker.touch()
    try:
        module = call.load(build_dir)
    except Exception as exc:
        report.error = trim_compiler_output(str(exc), call, str(build_dir))
        raise _Refused from None
    marker.unlink()
    report.compiled += 1
    report.keys.append(call.key())
    return module


def libraries(build_dir: Path) -> list[Path]:
    """The shared libraries a build left in `build_dir`."""
    return sorted(build_dir.glob("*.so"))


def objects(build_dir: Path) -> list[Path]:
    """The object files a build compiled the candidate's sources into (what its library links)."""
    return sorted(build_dir.glob("*.o"))


def built(build_dir: Path) -> bool:
    """Whether `build_dir` holds a finished build (an extension, no build in progress)."""
    return bool(libraries(build_dir)) and not (build_dir / _BUILDING).exists()


# ---------------------------------------------------------------------------- the evaluation's side


class Extensions:
    """The candidate's extensions in the evaluation process: load_inline loads what the compile
    process built and the evaluation process checked (`checked`: their libraries' symbols,
    checks/cuda_symbols.py), and the kernels they define are the candidate's own for the runtime
    checks."""

    def __init__(self, cache_root: Path, checked: Iterable[str] = ()) -> None:
        self.cache_root = cache_root
        self.checked = frozenset(checked)  # build keys whose libraries passed the symbol check
        self.calls: list[InlineCall] = []
        self._index_of: tuple[int, ...] = ()  # the calls the index below was built from
        self._kernels: set[str] = set()
        self._declared: set[str] = set()
        self._owned: dict[str, bool] = {}  # activity name -> owns(), for the same calls

    def install(self) -> Extensions:
        """Route load_inline to the builds for the rest of this (evaluation) process."""
        install(self._load)
        return self

    def _load(self, call: InlineCall) -> Any:
        build_dir = self.cache_root / call.key()
        if not built(build_dir) or call.key() not in self.checked:
            raise CudaBuildMissingError(
                f"load_inline(name={call.name!r}) was called with sources the compile phase did not build. "
                "Call load_inline at module level, with the same sources on every import."
            )
        self.calls.append(call)
        return call.load(build_dir)

    def _index(self) -> None:
        """Kernel names and opened namespaces of the loaded sources, parsed once per set of calls
        (owns() runs for every profiled activity, under the GPU lock)."""
        ids = tuple(map(id, self.calls))
        if ids != self._index_of:
            self._kernels = {k for call in self.calls for s in call.cuda_sources for k in kernel_names(s)}
            self._declared = {
                ns for call in self.calls for ns in namespaces(call.source_text())
            } - _LIBRARY_NAMESPACES
            self._index_of, self._owned = ids, {}

    @property
    def kernels(self) -> set[str]:
        self._index()
        return self._kernels

    def owns(self, activity: str) -> bool:
        """Whether a GPU activity name (CUPTI's demangled kernel name) is one of the candidate's
        __global__ kernels: `name(...)`, `void name<...>(...)`, or qualified by namespaces its
        sources open (never by a library's namespace)."""
        self._index()
        if activity not in self._owned:
            head = activity.strip().removeprefix("void ").replace("(anonymous namespace)::", "")
            parts = re.split(r"[<(]", head, maxsplit=1)[0].strip().split("::")
            self._owned[activity] = parts[-1] in self._kernels and all(
                p in self._declared for p in parts[:-1]
            )
        return self._owned[activity]

    def count_own(self, activities: Iterable[str]) -> int:
        return sum(1 for a in activities if self.owns(a))
