"""A randomly initialised HF checkpoint of a model's shapes (slime_ext.dev_engine.random_checkpoint.py):
the default model's size (Qwen3-8B: ~16.4 GB of bf16) for runs, benches and GPU tests on machines
that cannot download weights. The shapes come from configs/models/hf_configs/MODEL.json, the
file the launcher's model flags describe.

  python -m tools.build_random_checkpoint --model qwen3-8B --out "$CKPT_ROOT/Qwen3-8B-random"
  python -m tools.convert_hf_to_megatron --hf-dir "$CKPT_ROOT/Qwen3-8B-random" --out "$CKPT_ROOT/Qwen3-8B-random_torch_dist"

Exit code 0, or 2 with one `error: ...` line (unknown model, an existing --out without
--overwrite, too little disk).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.dev_engine.random_checkpoint import hf_shapes, write_random_checkpoint

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "models" / "hf_configs"


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.build_random_checkpoint", __doc__)
    p.add_argument(
        "--model", required=True, help=f"one of: {', '.join(sorted(c.stem for c in CONFIGS.glob('*.json')))}"
    )
    p.add_argument("--out", type=Path, required=True, help="HF model directory to write")
    p.add_argument("--layers", type=int, help="fewer layers than the model's (a quick try)")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = p.parse_args(argv)
    path = CONFIGS / f"{args.model}.json"
    try:
        if not path.is_file():
            raise ValueError(f"unknown --model {args.model!r}: no {path}")
        config = json.loads(path.read_text())
        if config.get("model_type") != "qwen3":
            raise ValueError(
                f"--model {args.model}: only qwen3 shapes are built (model_type {config.get('model_type')!r})"
            )
        if args.layers is not None:
            if not 1 <= args.layers <= config["num_hidden_layers"]:
                raise ValueError(f"--layers {args.layers}: 1 to {config['num_hidden_layers']}")
            config["num_hidden_layers"] = args.layers
        need = sum(2 * math.prod(s) for s in hf_shapes(config).values())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(args.out.parent).free
        if free < need * 1.05:
            raise ValueError(
                f"{args.out.parent}: {free / 1e9:.1f} GB free, the checkpoint needs {need / 1e9:.1f} GB"
            )
        nbytes = write_random_checkpoint(args.out, config, seed=args.seed, overwrite=args.overwrite)
    except (ValueError, FileExistsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"wrote {args.out}: {nbytes / 1e9:.2f} GB of bf16 weights, {config['num_hidden_layers']} layers, vocab {config['vocab_size']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
