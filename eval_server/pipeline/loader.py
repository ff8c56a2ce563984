"""Turn problem and candidate source strings into live Python modules on the eval device.

Sources are written to real files under the evaluation's private directory before import,
because Triton's JIT reads kernel source through `inspect` and cannot compile code that only
exists in an `exec`'d string. Inputs and weights are created directly on the evaluation device
(default-device context), never built on the CPU and copied: KernelBench L1 inputs reach GBs.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import random
import re
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eval_server.checks.static import EVALUATED_MODULE_PREFIX
from eval_server.isolation.audit import is_stdlib

_module_counter = itertools.count()
# static_checks forbids importing modules named so (the reference): one definition, there
MODULE_PREFIX = EVALUATED_MODULE_PREFIX
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# torch.nn.Module.__call__ plumbing: two frames in every forward traceback that say nothing.
_NOISE_FILES = (os.path.join("torch", "nn", "modules", "module.py"),)


def import_source(source: str, workdir: str | Path, stem: str) -> types.ModuleType:
    """Write `source` to `<workdir>/<stem>.py` and import it under a unique module name.

    Exceptions from the module body (SyntaxError included) propagate to the caller.
    """
    path = Path(workdir) / f"{stem}.py"
    path.write_text(source, encoding="utf-8")
    name = f"{MODULE_PREFIX}{stem}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python's `random` and NumPy, so get_inputs() is reproducible:
    inputs are regenerated from their seed instead of being kept alive. Not torch.manual_seed: it
    also seeds the XPU and MTIA backends, whose uninitialised lazy seeding formats the caller's
    stack each time (0.8 ms a seed on an H200 host; the judge seeds once per timed window)."""
    random.seed(seed)
    torch.default_generator.manual_seed(seed)
    # is_initialized first: is_available asks the driver each time (~0.1 ms, a runner's profile)
    if torch.cuda.is_initialized() or torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # applied at CUDA's initialisation when it comes later
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy ships with torch
        pass


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, list | tuple):
        return type(obj)(_to_device(o, device) for o in obj)
    return obj


def make_init_inputs(module: types.ModuleType, seed: int, device: torch.device) -> list[Any]:
    seed_everything(seed)
    with torch.device(device):
        init = module.get_init_inputs() if hasattr(module, "get_init_inputs") else []
    return list(_to_device(list(init), device))


def make_inputs(module: types.ModuleType, seed: int, device: torch.device) -> list[Any]:
    """Inputs for one trial, created on `device` (the default device is set while they are built)."""
    return make_input_sets(module, seed, device, 1)[0]


def make_input_sets(module: types.ModuleType, seed: int, device: torch.device, n: int) -> list[list[Any]]:
    """`n` successive calls of get_inputs() after one seeding: set j is reproduced by the same
    seed and j + 1 sets. One seeding for many calls (seeding every generator costs ~0.2 ms)."""
    seed_everything(seed)
    with torch.device(device):
        return [list(_to_device(list(module.get_inputs()), device)) for _ in range(n)]


def build_model(cls: type, init_inputs: Sequence[Any], seed: int, device: torch.device) -> torch.nn.Module:
    """Construct `cls(*init_inputs)` after seeding, with parameters allocated on `device`."""
    seed_everything(seed)
    with torch.device(device):
        model = cls(*init_inputs)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


def clone_args(args: Sequence[Any]) -> list[Any]:
    """Deep-enough copy of a list of inputs: tensors cloned, containers rebuilt, scalars shared."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a.detach().clone())
        elif isinstance(a, list | tuple):
            out.append(type(a)(clone_args(a)))
        else:
            out.append(a)
    return out


def format_exception_tail(
    exc: BaseException, workdir: str | Path, max_lines: int = 40, max_chars: int = 4000
) -> str:
    """The traceback a model can act on: evaluator and stdlib frames dropped, temp paths shortened,
    trimmed.

    Frames from this package and the standard library are removed because they only say *where
    we called the candidate* (for a syntax error: candidate.py and ast.py, nothing of the model's);
    the candidate's own lines and Triton's compiler messages are what matter.
    """
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR + os.sep)
        and not f.filename.endswith(_NOISE_FILES)
        and not f.filename.startswith("<frozen ")
        and not is_stdlib(f.filename)  # ast.parse, importlib, contextlib: how the evaluator got there
    ]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    text = "".join(lines).replace(str(workdir) + os.sep, "")
    text = re.sub(r'File "[^"]*?site-packages/', 'File "', text)
    out_lines = text.rstrip("\n").split("\n")
    if len(out_lines) > max_lines:
        out_lines = ["..."] + out_lines[-max_lines:]
    text = "\n".join(out_lines)
    if len(text) > max_chars:
        text = "..." + text[-max_chars:]
    return text
