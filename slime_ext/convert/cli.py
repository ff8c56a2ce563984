"""What the two converter CLIs share: run one conversion, report it, map errors to exit code 2."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from slime_ext.convert.convert import ConvertStats
from slime_ext.convert.errors import ConvertError

__all__ = ["run_conversion"]


def run_conversion(out: Path, convert: Callable[[], ConvertStats]) -> int:
    """0 after printing a summary line; 2 with one `error: ...` line on stderr for bad input."""
    start = time.monotonic()
    try:
        stats = convert()
    except ConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {out}: {stats.tensors} tensors, {stats.bytes_written / 1e9:.2f} GB "
        f"in {time.monotonic() - start:.1f} s"
    )
    return 0
