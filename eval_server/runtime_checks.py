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
from collections import Counter
from collections.abc import Iterable, Iterator
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
            # The interpreter moves data with torch ops; they are not the candidate's compute.
            with _disable_current_modes():
                return original(fn_self, *args, **kwargs)

        run.__wrapped__ = original  # type: ignore[attr-defined]
        cls.run = run

    @contextlib.contextmanager
    def recording(self) -> Iterator[LaunchRecorder]:
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
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("time", time),
        ("triton.JITFunction", JITFunction),
    ]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        spaces.append(("triton.InterpretedFunction", InterpretedFunction))
    return spaces


def poison_free_memory(nbytes: int, device: Any) -> None:
    """Make the next allocations on `device` return NaN-filled memory.

    The caching allocator hands freed blocks back to the next `torch.empty`; a candidate could
    get memory still holding the reference's (correct) results or intermediates and skip
    writing some elements. Dropping every cached block and then allocating, NaN-filling and
    freeing one large block means the candidate's outputs come out of that poisoned block, so
    an element it never writes stays NaN and fails the comparison.
    """
    if getattr(device, "type", "cpu") != "cuda" or nbytes <= 0:
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    block = torch.empty(nbytes // 4 + 1, dtype=torch.float32, device=device)
    block.fill_(float("nan"))
    torch.cuda.synchronize(device)
    del block


def python_threads() -> int:
    """Live Python threads; a forward that leaves one running may do work outside timing."""
    import threading

    return threading.active_count()
