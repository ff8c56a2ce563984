"""Reading table rows (jsonl / json / parquet) and writing files atomically.

Every output of the data tools goes through `atomic_write_text` / `atomic_write_jsonl`: the text
is written to a temporary file in the destination folder and renamed over the target only when
complete, so a failed run never leaves a half-written dataset behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from krl_common.fileio import atomic_write
from krl_common.validation import ValidationError

__all__ = ["TABLE_SUFFIXES", "atomic_write_jsonl", "atomic_write_text", "iter_jsonl", "read_rows"]

TABLE_SUFFIXES = (".jsonl", ".json", ".parquet")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` via a temporary file + rename (same folder, fsynced)."""
    atomic_write(path, text)


def atomic_write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line, atomically; returns the number of rows."""
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
    atomic_write_text(path, "".join(lines))
    return len(lines)


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for every non-blank line; bad JSON names the file and line."""
    p = Path(path)
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None


def _read_jsonl(p: Path) -> Iterator[dict[str, Any]]:
    for lineno, row in iter_jsonl(p):
        if not isinstance(row, dict):
            raise ValidationError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
        yield row


def _read_json(p: Path) -> Iterator[dict[str, Any]]:
    """A JSON array of objects, or JSON lines under a `.json` name (both occur in HF datasets)."""
    with p.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if not head.startswith("["):
        yield from _read_jsonl(p)
        return
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{p}: not valid JSON ({exc.msg})") from None
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise ValidationError(f"{p}[{i}]: expected a JSON object, got {type(row).__name__}")
        yield row


def _read_parquet(p: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is in the `data` extra
        raise RuntimeError(f"{p}: reading parquet needs pyarrow (pip install '.[data]')") from exc
    try:
        pf = pq.ParquetFile(p)
    except Exception as exc:  # pyarrow raises ArrowInvalid & co. for a file that is not parquet
        raise ValidationError(f"{p}: not a readable parquet file ({exc})") from None
    for batch in pf.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def read_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Rows of a `.jsonl`, `.json` (array of objects, or JSON lines) or `.parquet` file, as dicts,
    in file order."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"input file not found: {p}")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(p)
    if suffix == ".json":
        return _read_json(p)
    if suffix == ".parquet":
        return _read_parquet(p)
    raise ValidationError(
        f"{p}: unsupported file type {suffix!r}; expected one of {', '.join(TABLE_SUFFIXES)}"
    )
