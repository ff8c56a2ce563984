"""Generate Megatron architecture flags (a slime `MODEL_ARGS` bash array) from an HF config.json.

  python -m tools.gen_model_args --config /models/Qwen3-8B/config.json   # print to stdout
  python -m tools.gen_model_args --all                 # rewrite configs/models/*.sh from hf_configs/
  python -m tools.gen_model_args --all --check         # exit 1 if any file is stale

`--all` reads `<models-dir>/hf_configs/<name>.json` (default models dir: configs/models of this
repository) and writes `<models-dir>/<name>.sh`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from krl_common.cli import make_parser
from slime_ext.convert import ConvertError
from slime_ext.convert.megatron_args import render_model_args

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"


def expected_files(models_dir: Path) -> dict[Path, str]:
    """<name>.sh -> its generated text, for every hf_configs/<name>.json."""
    out = {}
    for cfg in sorted((models_dir / "hf_configs").glob("*.json")):
        source = f"configs/models/hf_configs/{cfg.name}"
        out[models_dir / f"{cfg.stem}.sh"] = render_model_args(json.loads(cfg.read_text()), source)
    return out


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.gen_model_args", __doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="an HF config.json (or a model directory holding one)")
    src.add_argument("--all", action="store_true", help="regenerate every configs/models/*.sh")
    p.add_argument(
        "--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="holds hf_configs/ and the *.sh it writes"
    )
    p.add_argument("--check", action="store_true", help="with --all: only compare, exit 1 when stale")
    a = p.parse_args(argv)
    try:
        if a.config is not None:
            path = a.config / "config.json" if a.config.is_dir() else a.config
            sys.stdout.write(render_model_args(json.loads(path.read_text()), path.name))
            return 0
        files = expected_files(a.models_dir)
        if not files:
            print(f"error: no *.json under {a.models_dir / 'hf_configs'}", file=sys.stderr)
            return 2
        stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
        if a.check:
            for path in stale:
                print(f"stale: {path}", file=sys.stderr)
            return 1 if stale else 0
        for path in stale:
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(files[path])
            tmp.replace(path)
            print(f"wrote {path}")
        return 0
    except (ConvertError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
