"""Run Megatron-LM's REAL `--use-checkpoint-args` path on a checkpoint, in its own process (Megatron
imports many modules and reads sys.argv): `parse_args` + `load_args_from_checkpoint`, and, for
comparison, `parse_args` of the model flags a run would pass. Writes one JSON report.

  python -m tests.real_megatron_load_args OUT.json CKPT_ROOT -- MODEL FLAGS...

Used by tests/integration/test_real_convert_checkpoint_args.py; MEGATRON_SRC (or third_party/)
must hold Megatron-LM's source.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import warnings
from typing import Any

from tests.real_slime import megatron_src


def _plain(ns: argparse.Namespace) -> dict[str, Any]:
    """JSON-able copy of a Namespace (Megatron's own args hold enums and dtypes: as strings)."""
    out: dict[str, Any] = {}
    for k, v in vars(ns).items():
        out[k] = v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    from megatron.training.arguments import parse_args

    old = sys.argv
    sys.argv = ["megatron", *argv]
    try:
        return parse_args(ignore_unknown_args=False)
    finally:
        sys.argv = old


def main(argv: list[str]) -> int:
    out, root, sep, *model_flags = argv
    assert sep == "--", argv
    sys.path.insert(0, str(megatron_src()))
    warnings.simplefilter("ignore")
    from megatron.training.checkpointing import load_args_from_checkpoint

    args = _parse(["--load", root, "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args"])
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        result = load_args_from_checkpoint(args)
    loaded, ckpt_args = result if isinstance(result, tuple) else (result, None)
    flags = _parse(model_flags)
    # validate_args' legacy rope step, which a run applies after parsing the flags
    if flags.use_rotary_position_embeddings:
        flags.position_embedding_type = "rope"
    report = {
        "loaded": _plain(loaded),
        "checkpoint_args": _plain(ckpt_args) if ckpt_args is not None else None,
        "flags": _plain(flags),
        "log": log.getvalue(),
    }
    with open(out, "w") as fh:
        json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
