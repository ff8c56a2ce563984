"""Every module of the evaluator is reachable from candidate code (`sys.modules`, a renamed
`getattr`: no audited call), so a module-level object the evaluator reads after candidate code has
run must be read-only or cross-checked against evidence the candidate cannot edit. This lists
the mutable module-level objects of `eval_server` and fails on any that is not reviewed below:
freeze a new one (MappingProxyType, tuple, frozenset) or add it with the reason it cannot change
a verdict."""

from __future__ import annotations

import importlib
import pkgutil
import re
import types
from collections.abc import Iterator
from typing import Any

import pytest

import eval_server

pytestmark = pytest.mark.unit

# (module, name) -> why a candidate's edit of it changes no verdict
REVIEWED = {
    ("eval_server.pipeline.context", "LAUNCHES"): "names checked against the source's functions "
    "(runtime.evaluator_state); on a GPU, counts and kernel identity come from CUPTI",
    ("eval_server.pipeline.candidate", "LAUNCHES"): "the same object",
    ("eval_server.pipeline.verification", "LAUNCHES"): "the same object (its count only decides whether "
    "a trial is profiled: a forged count adds a profiled trial, never lowers CUPTI's)",
    ("eval_server.pipeline.context", "THREADS"): "first layer only: work a thread does is seen by CUPTI, "
    "the verified timed calls and the escape checks",
    ("eval_server.pipeline.candidate", "THREADS"): "the same object",
    ("eval_server.checks.persisting_l2", "STATE"): "what the feedback says about the reset, not the reset",
    (
        "eval_server.checks.persisting_l2",
        "_RESOLVED",
    ): "the reset's entry point, resolved before any candidate; "
    "setting a persisting window needs ctypes or cuda-python (static rules, audit hook)",
    ("eval_server.pipeline.cuda_backend", "_BOUND"): "the real load_inline, bound before the candidate's "
    "import; what it loads is a build whose symbols were checked before (static.cuda_symbols)",
    ("eval_server.checks.cuda_symbols", "static_runtime_imports"): "a cache of the compiler's runtime "
    "archive; the symbol check runs in the evaluation process before the candidate is imported there",
    ("eval_server.pipeline.timing", "_cycles_per_ms"): "sizes the GPU delay before each trial: a wrong "
    "value lengthens or shortens the lead, which the escape checks bound",
    ("eval_server.pipeline.loader", "_module_counter"): "unique module names only",
    ("eval_server.checks.close_kernel", "_close_partials"): "a Triton kernel object (the comparison's); "
    "replacing its attributes is runtime.monkey_patch",
    (
        "eval_server.workers.triton_warmup",
        "_add_one",
    ): "a Triton kernel for the warm-up, before any candidate",
    # The judge/runner channel: candidate code runs only in the runner, whose copies serve its own
    # side of the protocol (which the judge treats as untrusted); the judge's copies are never
    # reachable from candidate code (another process).
    ("eval_server.gpu_ipc", "_lib"): "the driver library's handle (a cache); see above",
    ("eval_server.gpu_ipc", "_bound"): "bound driver entry points (a cache); see above",
    ("eval_server.wire", "_LEN"): "the frame length's struct; see above",
}

_IMMUTABLE = (
    int, float, complex, str, bytes, bool, type(None), frozenset, tuple, range, type, re.Pattern,
    types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.MappingProxyType, types.GenericAlias,
)  # fmt: skip
_SKIP_MODULES = ("eval_server.app", "eval_server.__main__", "eval_server.launch")  # the server's side


def _mutable_globals() -> Iterator[tuple[str, str, Any]]:
    for info in pkgutil.walk_packages(eval_server.__path__, "eval_server."):
        if info.name in _SKIP_MODULES:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or isinstance(value, _IMMUTABLE):
                continue
            if (
                type(value).__module__ in ("typing", "logging", "__future__")
                or callable(value)
                and not hasattr(value, "__dict__")
            ):
                continue
            if isinstance(value, types.MappingProxyType):
                continue
            yield info.name, name, value


def test_every_mutable_module_object_of_the_evaluator_is_reviewed() -> None:
    found = {(m, n): type(v).__name__ for m, n, v in _mutable_globals()}
    unreviewed = {k: v for k, v in found.items() if k not in REVIEWED}
    assert not unreviewed, (
        "module-level objects candidate code could edit through sys.modules; make them read-only or "
        f"review them in this test: {unreviewed}"
    )
    assert set(REVIEWED) <= set(found), (
        f"reviewed but gone (remove from the list): {set(REVIEWED) - set(found)}"
    )


def test_tables_the_verdict_reads_are_read_only() -> None:
    from eval_server.checks import compare, cuda_static
    from eval_server.schema import TOLERANCE_PROFILES

    with pytest.raises(TypeError):
        TOLERANCE_PROFILES["default"]["float32"] = 1e9  # type: ignore[index]
    with pytest.raises(TypeError):
        compare.TOLERANCE_PROFILES["loose"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        cuda_static.SOURCE_RULES["static.cuda_library"] = ("", lambda src: [])  # type: ignore[index]
