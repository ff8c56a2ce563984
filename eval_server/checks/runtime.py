"""Runtime evidence about what a candidate really did during forward.

- LaunchRecorder counts Triton kernel launches by wrapping the JIT entry point (compiled and
  interpreter mode) at class level before the candidate is imported: a kernel that is defined
  but never launched is caught no matter how the source is written.
- TorchOpRecorder is a TorchDispatchMode that lists the aten ops executed during forward, so
  "a trivial kernel launch while torch does the real work" is caught at runtime. Launches are
  excluded from recording (the interpreter itself uses torch ops to move data).
- NamespaceSnapshot records the identity of torch/triton attributes before the candidate is
  imported and reports any that were replaced (monkey-patched timers, synchronize, comparators).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

# Entering a dispatch mode imports torch._dynamo, which rebinds torch.manual_seed; import it
# before any NamespaceSnapshot so that this legitimate rebinding is not reported as a patch.
import torch
import torch._dynamo  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# aten ops a Triton candidate may run in torch: allocation, views, copies and metadata.
# Everything else counts as torch doing the computation.
ALLOWED_ATEN_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "zero_",
        "fill_",
        "arange",
        "scalar_tensor",
        "lift_fresh",
        "lift_fresh_copy",
        "detach",
        "alias",
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "expand",
        "expand_as",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "slice",
        "select",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "narrow",
        "view_as",
        "clone",
        "contiguous",
        "copy_",
        "_to_copy",
        "to",
        "resize_",
        "set_",
        "_local_scalar_dense",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "is_contiguous",
        "cat",
        "stack",
        "pad",
        "constant_pad_nd",
        "_has_compatible_shallow_copy_type",
        "is_same_size",
        "_copy_from",
        "_copy_from_and_resize",
        "record_stream",
        "diagonal",
        "movedim",
        "_reshape_copy",
        "view_as_real",
        "view_as_complex",
        "conj",
        "resolve_conj",
        "resolve_neg",
        "item",
        "numpy_T",
        "split_copy",
        "empty_permuted",
    }
)


class LaunchRecorder:
    """Counts `kernel[grid](...)` launches of @triton.jit functions while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.launches: Counter[str] = Counter()
        self.op_recorder: TorchOpRecorder | None = None
        self._installed = False

    @property
    def count(self) -> int:
        return sum(self.launches.values())

    def reset(self) -> None:
        self.launches.clear()

    def install(self) -> None:
        """Patch the run() of Triton's JIT classes. Idempotent; call before candidate import."""
        if self._installed:
            return
        from triton.runtime.jit import JITFunction

        classes: list[type] = [JITFunction]
        with contextlib.suppress(ImportError):
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        for cls in classes:
            self._wrap(cls)
        self._installed = True

    def _wrap(self, cls: type) -> None:
        original = cls.run
        recorder = self

        def run(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.active and not kwargs.get("warmup", False):
                name = getattr(getattr(fn_self, "fn", None), "__name__", None) or getattr(
                    fn_self, "__name__", "?"
                )
                recorder.launches[str(name)] += 1
                grid = kwargs.get("grid")
                ops = recorder.op_recorder
                if callable(grid) and ops is not None:
                    # The grid callable is candidate code: keep recording the torch ops it runs.
                    def recorded_grid(
                        *a: Any, _grid: Any = grid, _ops: TorchOpRecorder = ops, **k: Any
                    ) -> Any:
                        with _ops:
                            return _grid(*a, **k)

                    kwargs["grid"] = recorded_grid
            # The interpreter moves data with torch ops; they are not the candidate's compute.
            with _disable_current_modes():
                return original(fn_self, *args, **kwargs)

        run.__wrapped__ = original  # type: ignore[attr-defined]
        cls.run = run

    @contextlib.contextmanager
    def recording(self, ops: TorchOpRecorder | None = None) -> Iterator[LaunchRecorder]:
        self.active = True
        self.op_recorder = ops
        try:
            yield self
        finally:
            self.active = False
            self.op_recorder = None


class ThreadStartRecorder:
    """Counts threads started by candidate code while `active` (joined or not).

    A thread that is joined before forward returns leaves no trace in the live-thread count,
    yet torch ops it runs escape the (thread-local) dispatch recorder. Every thread entry point
    is wrapped at import time of the worker; a start counts when the first caller frame outside
    the threading machinery is the candidate's file (threads started by torch or triton
    internals do not count).
    """

    _STDLIB_PARTS = ("threading.py", "_threading_local.py", os.sep + "concurrent" + os.sep, "<frozen")

    def __init__(self, candidate_file: str = "candidate.py") -> None:
        self.active = False
        self.started: list[str] = []
        self.candidate_file = candidate_file
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        import _thread
        import threading

        self._wrap(threading.Thread, "start", is_method=True)
        for module in (_thread, threading):
            for attr in (
                "start_new_thread",
                "_start_new_thread",
                "start_joinable_thread",
                "_start_joinable_thread",
            ):
                if hasattr(module, attr):
                    self._wrap(module, attr, is_method=False)
        self._installed = True

    def _wrap(self, owner: Any, attr: str, is_method: bool) -> None:
        original = getattr(owner, attr)
        recorder = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if recorder.active:
                where = recorder._candidate_caller()
                if where:
                    recorder.started.append(where)
            return original(*args, **kwargs)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, attr, wrapper)

    def _candidate_caller(self) -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.endswith(os.sep + "runtime_checks.py") or any(p in name for p in self._STDLIB_PARTS):
                frame = frame.f_back
                continue
            if os.path.basename(name) == self.candidate_file:
                return f"{self.candidate_file}:{frame.f_lineno}"
            return None
        return None

    @contextlib.contextmanager
    def recording(self) -> Iterator[ThreadStartRecorder]:
        self.started = []
        self.active = True
        try:
            yield self
        finally:
            self.active = False


class TorchOpRecorder(TorchDispatchMode):
    """Records the aten overload packets executed inside the `with` block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def compute_ops(self) -> dict[str, int]:
        """Ops outside ALLOWED_ATEN_OPS with their call counts."""
        return {
            op: n
            for op, n in sorted(self.ops.items())
            if op not in ALLOWED_ATEN_OPS and op.rstrip("_") not in ALLOWED_ATEN_OPS
        }


class NamespaceSnapshot:
    """Identity of every attribute of some modules/classes, to detect monkey-patching later."""

    def __init__(self, namespaces: Iterable[tuple[str, Any]]) -> None:
        # Keep the original objects, not just their id(): an original whose only reference was
        # the namespace is freed when replaced, and its id can be reused by the replacement.
        self._saved: dict[str, tuple[Any, dict[str, Any]]] = {}
        for label, ns in namespaces:
            self._saved[label] = (ns, dict(vars(ns)))

    def changed(self) -> list[str]:
        """'<namespace>.<attr>' for every attribute that was replaced or deleted since the snapshot."""
        out = []
        for label, (ns, originals) in self._saved.items():
            current = vars(ns)
            for key, original in originals.items():
                if key not in current or current[key] is not original:
                    out.append(f"{label}.{key}")
        return out


_len_function_modes = getattr(torch._C, "_len_torch_function_stack", lambda: 0)
_len_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_GLOBAL_MODULE_HOOKS = (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs", "_global_backward_hooks", "_global_backward_pre_hooks",
)  # fmt: skip


class GlobalStateSnapshot:
    """Process-wide switches that change what every module or torch call computes: global
    nn.Module hooks, and torch function / dispatch modes left active. The reference runs after
    candidate code (pipeline/evaluate.py), so these must be as they were before the candidate existed."""

    def __init__(self) -> None:
        self._saved = self._now()

    @staticmethod
    def _now() -> dict[str, int]:
        import torch.nn.modules.module as module

        state = {name: len(getattr(module, name, None) or ()) for name in _GLOBAL_MODULE_HOOKS}
        state["torch function modes active"] = _len_function_modes()
        state["torch dispatch modes active"] = _len_dispatch_modes()
        return state

    def changed(self) -> list[str]:
        """'<what> (<before> -> <now>)' for every count that differs from the snapshot."""
        return [f"{k} ({self._saved[k]} -> {v})" for k, v in self._now().items() if v != self._saved[k]]


def reference_namespaces(module: ModuleType, model: Any) -> list[tuple[str, Any]]:
    """The reference module and every class its model's modules are made of (torch.nn classes
    included): replacing `forward` of one of them would change the reference's output."""
    spaces: dict[str, Any] = {"reference": module}
    for sub in model.modules():
        for cls in type(sub).__mro__[:-1]:  # all but object
            spaces.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return list(spaces.items())


def default_guarded_namespaces() -> list[tuple[str, ModuleType | type]]:
    """What the evaluator itself relies on: torch entry points, Tensor methods, CUDA timing."""
    import time

    import torch.nn.functional as F
    from triton.runtime.jit import JITFunction

    spaces: list[tuple[str, Any]] = [
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch._C.TensorBase", torch._C.TensorBase),
        ("torch.nn.functional", F),
        ("torch.nn.Module", torch.nn.Module),
        ("torch.nn.modules.module", sys.modules["torch.nn.modules.module"]),  # its global hook tables
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("time", time),
        ("triton.JITFunction", JITFunction),
    ]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        spaces.append(("triton.InterpretedFunction", InterpretedFunction))
    return spaces + evaluator_namespaces()


def evaluator_namespaces() -> list[tuple[str, Any]]:
    """Every loaded module of this package and the classes it defines: their helpers are looked
    up at call time (a candidate replacing `eval_server.checks.compare._tensor_close` would pass any output)."""
    spaces: list[tuple[str, Any]] = []
    for name, module in sorted(sys.modules.items()):
        if not (name == "eval_server" or name.startswith("eval_server.")) or module is None:
            continue
        spaces.append((name, module))
        spaces += [
            (f"{name}.{attr}", obj)
            for attr, obj in sorted(vars(module).items())
            if isinstance(obj, type) and obj.__module__ == name
        ]
    return spaces


class RawCudaBytes:
    """A non-owning view of raw device memory, through the CUDA array interface (torch.as_tensor)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
        }


def poison_free_memory(nbytes: int, device: Any) -> str:
    """Fill every free block of the CUDA caching allocator with 0xFF bytes (NaN in every float dtype).

    The caching allocator hands freed blocks to the next `torch.empty`; a candidate could get
    memory still holding earlier results (or fresh zeros, right for half of a ReLU) and skip
    writing some elements. Cached blocks are dropped, a free block of `nbytes` is reserved so the
    candidate's outputs fit into existing (poisoned) memory, then every inactive block the
    allocator holds (remainders of partly used segments included) is filled with 0xFF: an
    element the candidate never writes reads NaN (or -1 for integers) and fails the comparison.
    Returns how it poisoned ("snapshot" or the "blocks" fallback) for diagnostics.
    """
    if getattr(device, "type", "cpu") != "cuda" or nbytes <= 0:
        return "none"
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    # Reserve blocks (large pool: the outputs' size; small pool: 32 x 512 KiB) so the candidate's
    # allocations fit into memory poisoned below, then free them back to the allocator's cache.
    _reserve_blocks(nbytes, device, fill=False)
    mode = "snapshot"
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device") != index:
                continue
            address = segment["address"]
            for blk in segment["blocks"]:
                start = blk.get("address", address)
                if blk["state"] == "inactive" and blk["size"] > 0:
                    torch.as_tensor(RawCudaBytes(start, blk["size"]), device=device).fill_(255)
                address = start + blk["size"]
    except Exception:  # noqa: BLE001 - no usable snapshot: poison the reserved blocks themselves
        _reserve_blocks(nbytes, device, fill=True)
        mode = "blocks"
    torch.cuda.synchronize(device)
    return mode


def _reserve_blocks(nbytes: int, device: Any, fill: bool) -> None:
    big = torch.empty(nbytes, dtype=torch.uint8, device=device)
    small = [torch.empty(1 << 19, dtype=torch.uint8, device=device) for _ in range(32)]
    if fill:
        big.fill_(255)
        for block in small:
            block.fill_(255)
    del big, small


# GPU kernels a Triton candidate may cause besides its own: copies, fills, transfers to the GPU.
_ALLOWED_KERNEL_PATTERNS = (
    "direct_copy_kernel", "FillFunctor", "CatArrayBatchedCopy", "copy_kernel", "Memset", "Memcpy DtoD",
    "Memcpy HtoD", "elementwise_kernel_with_index", "fill_kernel",
)  # fmt: skip


# What older Triton versions append to a kernel's name (`relu_kernel_0d1d2de`): argument specialisations.
_TRITON_SUFFIX = re.compile(r"(?:_[0-9][0-9a-z]*)?")
# Newer Triton names the kernel `module.qualname`, which the PTX backend spells `module_$_qualname`.
_MODULE_PATH = re.compile(r"\.|_\$_")


def is_triton_kernel(name: str, triton_names: Iterable[str]) -> bool:
    """Whether the device activity `name` is one of the @triton.jit functions `triton_names`: the
    function's name exactly (after a module path), or with Triton's specialisation suffix. Not a
    prefix match: a kernel
    named `sm90` or `void` would otherwise claim cuBLAS's `sm90_xmma_gemm_...` or ATen's
    `void at::native::...` as its own."""
    base = name if (" " in name or "(" in name) else _MODULE_PATH.split(name)[-1]
    return any(n and base.startswith(n) and _TRITON_SUFFIX.fullmatch(base, len(n)) for n in triton_names)


def classify_kernels(
    names: Iterable[str], triton_names: Iterable[str], is_own: Callable[[str], bool] | None = None
) -> tuple[list[str], list[str]]:
    """Split device activity recorded during forward into (foreign compute kernels, device->host copies).

    A name counts as the candidate's when it is one of its launched @triton.jit functions
    (`is_triton_kernel`: Triton names the CUDA kernel after the function) or when `is_own` says so
    (backend "cuda": its extension's __global__ kernels); copies and fills are allowed; any other
    kernel (ATen, cuBLAS, cuDNN, ...) is torch or a library doing the work.
    """
    own = tuple(n for n in triton_names if n)
    foreign: list[str] = []
    to_host: list[str] = []
    for name in names:
        if is_triton_kernel(name, own) or (is_own is not None and is_own(name)):
            continue
        if "Memcpy DtoH" in name:
            to_host.append(name)
        elif not any(p in name for p in _ALLOWED_KERNEL_PATTERNS):
            foreign.append(name)
    return foreign, to_host


_STREAM_MARKER = getattr(torch.cuda, "_sleep", None)  # bound before any candidate is imported


def profile_device_activity(
    fn: Any, device: Any, times: list[tuple[str, float]] | None = None
) -> tuple[Any, list[str], list[str]]:
    """Run `fn()` under the CUDA activity profiler; return its result, the device activity names,
    and the names of those that ran on another stream than the caller's current one; with
    `times`, append (name, device microseconds) of each activity to it.

    CUPTI sees every kernel on the device, from any thread and behind any dispatch trick, so
    this is the backstop for torch or library compute that the in-process recorders miss. The
    current stream is identified by a marker kernel (a 1-cycle GPU sleep) launched on it first;
    if this torch does not expose stream ids, the third list is empty.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    marker = _STREAM_MARKER
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if marker is not None:
            marker(1)
        out = fn()
        torch.cuda.synchronize(device)
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "spin_kernel" not in e.name]
    if times is not None:
        times.extend((e.name, float(e.time_range.elapsed_us())) for e in events)
    return out, [e.name for e in events], _off_stream(prof, DeviceType.CUDA)


def _off_stream(prof: Any, cuda: Any) -> list[str]:
    """Names of device activities on another stream than the marker's (see above)."""
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]
        streams = {e.name(): e.device_resource_id() for e in events if "spin_kernel" in e.name()}
        if len(set(streams.values())) != 1:
            return []
        (current,) = set(streams.values())
        return [
            e.name() for e in events if "spin_kernel" not in e.name() and e.device_resource_id() != current
        ]
    except (AttributeError, TypeError, RuntimeError):  # pragma: no cover - depends on the torch build
        return []


def python_threads() -> int:
    """Live Python threads; a forward that leaves one running may do work outside timing."""
    import threading

    return threading.active_count()
