"""The Megatron checkpoint directory layout that `--load` / `--ref-load` read.

    <root>/latest_checkpointed_iteration.txt   "release" or the iteration number
    <root>/release/  or  <root>/iter_0000123/   one torch_dist checkpoint:
        .metadata, __0_0.distcp, ...            torch DCP files (the sharded model tensors)
        metadata.json                           {"sharded_backend": "torch_dist", ...}
        common.pt                               torch.save of the non-sharded state

Megatron's `load_checkpoint` reads `checkpoint_version` and `iteration` from common.pt, and `args`
(an argparse.Namespace) where present; slime's `tools/convert_torch_dist_to_hf.py` requires `args`.
A release checkpoint loads no optimizer or RNG state, which is what an initial `--load`/`--ref-load`
wants.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from slime_ext.convert.errors import ConvertError

__all__ = [
    "TRACKER",
    "atomic_output_dir",
    "checkpoint_subdir",
    "resolve_checkpoint_dir",
    "write_checkpoint_files",
]

TRACKER = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 3.0
SHARDED_CONFIG = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


def checkpoint_subdir(iteration: int | None) -> str:
    """`release` for None, else Megatron's `iter_%07d`."""
    if iteration is None:
        return "release"
    if iteration < 0:
        raise ConvertError(f"iteration must be >= 0, got {iteration}")
    return f"iter_{iteration:07d}"


def write_checkpoint_files(
    root: Path, ckpt_dir: Path, iteration: int | None, args: argparse.Namespace | None = None
) -> None:
    """common.pt, metadata.json and the tracker file around a finished DCP directory.

    `args` goes into common.pt as Megatron's `save_checkpoint` puts the run's arguments there."""
    common: dict[str, object] = {"checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration or 0}
    if args is not None:
        common["args"] = args
    torch.save(common, ckpt_dir / "common.pt")
    (ckpt_dir / "metadata.json").write_text(json.dumps(SHARDED_CONFIG))
    (root / TRACKER).write_text("release" if iteration is None else str(iteration))


def resolve_checkpoint_dir(path: Path) -> Path:
    """A root with a tracker file, or a release/iter_XXXXXXX directory -> the DCP directory."""
    path = Path(path)
    if not path.exists():
        raise ConvertError(f"checkpoint path {path} does not exist")
    tracker = path / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        if text == "release":
            sub = path / "release"
        elif text.isdigit():
            sub = path / checkpoint_subdir(int(text))
        else:
            raise ConvertError(f"{tracker} holds {text!r}, expected 'release' or an iteration number")
        if not sub.is_dir():
            raise ConvertError(f"{tracker} points to {sub.name}, which does not exist")
        path = sub
    if not (path / ".metadata").is_file():
        raise ConvertError(f"{path} is not a torch_dist checkpoint (no {TRACKER}, no .metadata)")
    config = path / "metadata.json"
    if config.is_file():
        backend = json.loads(config.read_text()).get("sharded_backend")
        if backend != "torch_dist":
            raise ConvertError(f"{config}: sharded_backend is {backend!r}, only 'torch_dist' is supported")
    return path


@contextmanager
def atomic_output_dir(out_dir: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `out_dir`; rename it to `out_dir` only on success.

    A failed run removes the temporary directory, so nothing that looks like a checkpoint is left."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ConvertError(f"output {out_dir} already exists (pass --overwrite to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; a model directory is ordinary data
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
