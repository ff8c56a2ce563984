"""slime's REAL source as a test partner (tests/integration/test_real_slime_*.py).

Where `tests/slime_double` is a labelled double of the few slime pieces the plug-ins touch, this
module imports upstream slime itself (THUDM/slime @ 624b824a) and, where needed, Megatron-LM
(@ 1dcf0daf with slime's patches) from source checkouts, so the plug-ins run through slime's own
conversion, normalisation, advantage, logging, evaluation and argument code. The sources are not
part of this repository: `scripts/fetch_upstream.sh` brings them to `third_party/`; `SLIME_SRC` and
`MEGATRON_SRC` point elsewhere. Without them the tests skip, saying how to get them.

slime imports Ray, SGLang, the SGLang router, W&B, aiohttp and pylatexenc at module level. Where
one of those is not installed, `STAND_IN_MODULES` puts a labelled TEST DOUBLE in `sys.modules`:
each holds only the names slime imports, and any use of them raises, because no test exercises
them (the one exception, `ray.remote`, returns the class unchanged so that slime's RolloutManager
can be built in-process without Ray). An installed package is always used as it is.

The double (tests/slime_double) and the real package share the name `slime`: `real_slime()`
swaps the real one in for the duration of a test module and puts back what was there after.
Real modules are imported once per process and kept aside between uses.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.slime_double import DOUBLE_DIR

__all__ = [
    "MEGATRON_SRC",
    "SLIME_SRC",
    "STAND_IN_MODULES",
    "megatron_src",
    "missing_source_reason",
    "real_slime",
    "record_logs",
    "rollout_manager",
    "slime_args",
    "slime_src",
]

REPO = Path(__file__).resolve().parents[1]
SLIME_SRC = "SLIME_SRC"
MEGATRON_SRC = "MEGATRON_SRC"
HOW_TO_GET = "run scripts/fetch_upstream.sh (clones both into third_party/), or set SLIME_SRC / MEGATRON_SRC"


def slime_src() -> Path:
    return Path(os.environ.get(SLIME_SRC) or REPO / "third_party" / "slime")


def megatron_src() -> Path:
    return Path(os.environ.get(MEGATRON_SRC) or REPO / "third_party" / "Megatron-LM")


def missing_source_reason(*, megatron: bool = False) -> str | None:
    """Why the real-slime tests cannot run here, or None when the sources are present."""
    if not (slime_src() / "slime" / "utils" / "types.py").is_file():
        return f"slime's source is not at {slime_src()}: {HOW_TO_GET}"
    if megatron and not (megatron_src() / "megatron" / "training" / "arguments.py").is_file():
        return f"Megatron-LM's source is not at {megatron_src()}: {HOW_TO_GET}"
    return None


# --------------------------------------------------------------------------- stand-ins


class _NotExercised(type):
    """Metaclass of the stand-in classes: building one, or reading any attribute, raises."""

    def __getattr__(cls, name: str) -> Any:
        raise RuntimeError(
            f"TEST DOUBLE {cls.__module__}.{cls.__name__}.{name}: not exercised by these tests"
        )

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"TEST DOUBLE {cls.__module__}.{cls.__name__}: not exercised by these tests")


def _unused_function(module: str, name: str) -> Any:
    def unused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"TEST DOUBLE {module}.{name}: not exercised by these tests")

    unused.__name__ = name
    return unused


class _StandInModule(types.ModuleType):
    """A TEST DOUBLE module holding only the names slime imports from it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"TEST DOUBLE module {self.__name__}: {name} is not provided (not exercised)")


def _remote(cls: Any = None, **options: Any) -> Any:
    """Stand-in for `ray.remote`: the class itself (tests call RolloutManager in-process)."""
    return cls if cls is not None else (lambda c: c)


# module -> {name: kind}; kinds: "class", "function", a str constant, or a callable to use as is.
STAND_IN_MODULES: dict[str, dict[str, Any]] = {
    "ray": {"remote": _remote, "get": "function", "put": "function"},
    "ray.util": {},
    "ray.util.scheduling_strategies": {"PlacementGroupSchedulingStrategy": "class"},
    "sglang": {},
    "sglang.srt": {},
    # names only: the memory tags slime passes to its engines' offload/onload calls
    "sglang.srt.constants": {
        "GPU_MEMORY_TYPE_WEIGHTS": "weights",
        "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "GPU_MEMORY_TYPE_CUDA_GRAPH": "cuda_graph",
    },
    "sglang.srt.server_args": {"ServerArgs": "class"},
    "sglang.srt.utils": {"kill_process_tree": "function"},
    "sglang_router": {},
    "sglang_router.launch_router": {"RouterArgs": "class"},
    "wandb": {"log": "function", "init": "function", "finish": "function"},
    "aiohttp": {"ClientSession": "class", "ClientTimeout": "class", "TCPConnector": "class"},
    "pylatexenc": {},
    "pylatexenc.latex2text": {"LatexNodes2Text": "class"},
}


def _installed(name: str) -> bool:
    top = name.split(".")[0]
    if top in sys.modules and not isinstance(sys.modules[top], _StandInModule):
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _stand_in(name: str, names: dict[str, Any]) -> types.ModuleType:
    module = _StandInModule(name, f"TEST DOUBLE of {name} (tests/real_slime.py): not the real package")
    module.__path__ = []  # a package, so that submodule stand-ins import
    # a spec without a loader: importlib.util.find_spec answers (accelerate probes wandb that way,
    # then finds no distribution metadata and treats it as absent) instead of raising
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    for attr, kind in names.items():
        if kind == "class":
            value: Any = _NotExercised(attr, (), {"__module__": name})
        elif kind == "function":
            value = _unused_function(name, attr)
        else:
            value = kind
        setattr(module, attr, value)
    return module


def _stand_ins() -> dict[str, types.ModuleType]:
    """Stand-ins for the packages of STAND_IN_MODULES that are not installed."""
    out: dict[str, types.ModuleType] = {}
    for name, names in STAND_IN_MODULES.items():
        if _installed(name):
            continue
        out[name] = _stand_in(name, names)
        parent, _, child = name.rpartition(".")
        if parent in out:
            setattr(out[parent], child, out[name])
    return out


# --------------------------------------------------------------------------- the swap


def _is_slime(name: str) -> bool:
    return name == "slime" or name.startswith("slime.")


_kept: dict[str, types.ModuleType] = {}  # real slime modules and stand-ins, between uses


@contextmanager
def real_slime(*, megatron: bool = False) -> Iterator[None]:
    """Make `import slime...` resolve to slime's real source (and Megatron-LM's, if asked) for the
    duration, with stand-ins for missing third-party packages; skips when a source is absent."""
    reason = missing_source_reason(megatron=megatron)
    if reason:
        pytest.skip(reason)
    saved_path = list(sys.path)
    saved = {k: v for k, v in sys.modules.items() if _is_slime(k)}
    for name in saved:
        del sys.modules[name]
    stand_ins = {k: v for k, v in _kept.items() if not _is_slime(k)} or _stand_ins()
    sys.modules.update({k: v for k, v in stand_ins.items() if k not in sys.modules})
    sys.modules.update({k: v for k, v in _kept.items() if _is_slime(k)})
    extra = [str(slime_src())] + ([str(megatron_src())] if megatron else [])
    sys.path[:] = extra + [p for p in saved_path if Path(p).resolve() != DOUBLE_DIR and p not in extra]
    try:
        yield
    finally:
        _kept.update({k: v for k, v in sys.modules.items() if _is_slime(k)})
        _kept.update(stand_ins)
        for name in [k for k in sys.modules if _is_slime(k)]:
            del sys.modules[name]
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = saved_path


# --------------------------------------------------------------------------- arguments


# Arguments of Megatron's and SGLang's parsers that slime's rollout code reads, with their defaults.
OTHER_PARSERS = {
    "load": None, "save": None, "ref_load": None, "save_interval": None, "micro_batch_size": 1,
    "sglang_server_concurrency": 512, "sglang_dp_size": None, "sglang_router_ip": None, "sglang_router_port": None,
}  # fmt: skip


def slime_args(argv: list[str], **other: Any) -> argparse.Namespace:
    """slime's argument namespace for `argv`, from slime's own code: its pre-parse flags and its
    argument groups (`get_slime_extra_args_provider`) parsed like `parse_args` does, then
    `slime_validate_args` (which also loads `--custom-config-path` and the eval datasets). Megatron's
    and SGLang's parsers are not run (test_real_slime_args.py runs the whole parse_args);
    `other` sets the arguments of those parsers that slime's rollout code reads (OTHER_PARSERS
    gives their defaults). Call inside `real_slime()`."""
    from slime.utils import arguments

    with mock.patch.object(sys, "argv", ["train.py", *argv]):
        pre = arguments._pre_parse_mode()
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.get_slime_extra_args_provider()(parser)
    args, unknown = parser.parse_known_args(argv)
    flags = [a for a in unknown if a.startswith("--")]
    if flags:
        raise ValueError(f"not slime arguments: {flags}")
    for key, value in {**OTHER_PARSERS, **other, **vars(pre)}.items():
        setattr(args, key, value)
    arguments.slime_validate_args(args)
    return args


# --------------------------------------------------------------------------- RolloutManager


def rollout_manager(args: argparse.Namespace) -> Any:
    """slime's RolloutManager with the attributes its __init__ sets for rollout, conversion and
    eval calls, built in-process: no Ray actor, no engines (the tests supply the rollout
    function's partners). Call inside `real_slime()`."""
    from slime.ray import rollout as ray_rollout
    from slime.utils.misc import load_function

    cls = getattr(getattr(ray_rollout.RolloutManager, "__ray_metadata__", None), "modified_class", None)
    mgr = object.__new__(cls or ray_rollout.RolloutManager)
    mgr.args, mgr.data_source, mgr._health_monitors = args, None, []
    mgr.generate_rollout = load_function(args.rollout_function_path)
    mgr.eval_generate_rollout = load_function(args.eval_function_path)
    hook = args.custom_reward_post_process_path
    mgr.custom_reward_post_process_func = load_function(hook) if hook else None
    mgr.custom_convert_samples_to_train_data_func = None
    return mgr


def record_logs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record what slime would send to W&B / TensorBoard (its `logging_utils.log`, the sink)."""
    from slime.observability import logging_utils

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(logging_utils, "log", lambda args, metrics, step_key: calls.append(dict(metrics)))
    return calls
