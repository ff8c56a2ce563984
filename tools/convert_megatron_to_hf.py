"""Convert a Megatron torch_dist checkpoint to Hugging Face safetensors (CPU, streaming).

`--input` is a checkpoint root (with latest_checkpointed_iteration.txt) or one `release/` or
`iter_XXXXXXX/` directory, saved at any TP/PP size. The architecture comes from `--hf-config-dir`
(the original HF model directory: every file except weights - config, tokenizer, generation
config - is copied to the output). The padded vocabulary is cut back to the config's vocab_size.

  python -m tools.convert_megatron_to_hf --input /ckpt/run1 --hf-config-dir /models/Qwen3-8B --out /hf/run1
  python -m tools.convert_megatron_to_hf --input /ckpt/run1/iter_0000100 --hf-config-dir H --out O --dtype bf16
"""

from __future__ import annotations

import sys
from pathlib import Path

from krl_common.cli import make_parser
from slime_ext.convert import megatron_to_hf
from slime_ext.convert.cli import run_conversion
from slime_ext.convert.hf_io import DTYPES


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.convert_megatron_to_hf", __doc__)
    p.add_argument("--input", type=Path, required=True, help="checkpoint root or release/iter_XXXXXXX dir")
    p.add_argument("--hf-config-dir", type=Path, required=True, help="original HF model directory")
    p.add_argument("--out", type=Path, required=True, help="HF directory to create (must not exist)")
    p.add_argument("--vocab-size", type=int, default=None, help="HF vocab size (default: from config.json)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast weights (default: keep)")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="safetensors shard size in GB")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    a = p.parse_args(argv)
    if a.max_shard_gb <= 0:
        p.error("--max-shard-gb must be > 0")
    return run_conversion(
        a.out,
        lambda: megatron_to_hf(
            a.input,
            a.out,
            a.hf_config_dir,
            vocab_size=a.vocab_size,
            dtype=DTYPES[a.dtype] if a.dtype else None,
            max_shard_bytes=int(a.max_shard_gb * 1e9),
            overwrite=a.overwrite,
            progress=not a.no_progress,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
