"""Atomic file output: the one temporary-file + fsync + rename writer of the project.

Every tool output that another step reads (prompt data, SFT data, split manifests, reports) goes
through `atomic_output`: a failed or interrupted run leaves the previous file (or none), never a
half-written one that looks valid.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_output", "atomic_write", "missing_local_dir"]


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """A file object (`mode` "w" text utf-8 or "wb") whose content replaces `path` only when the
    block ends without an exception; the temporary file sits in the same folder (same device)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write `data` (text as utf-8) to `path` atomically."""
    if not isinstance(data, (bytes, str)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    with atomic_output(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def missing_local_dir(name_or_path: str, what: str) -> str | None:
    """Why `name_or_path` cannot be loaded, when it is written as a local path (absolute, ./, ../
    or ~) and no such directory exists; None otherwise (a Hub id like `Qwen/Qwen3-8B` is left to
    the loader). Without this, transformers answers a missing local path with a Hub error about
    repository ids."""
    if not name_or_path.startswith(("/", "./", "../", "~")):
        return None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return None
    return f"{what}: {name_or_path} " + ("is a file, not a model directory" if path.exists() else "does not exist")
