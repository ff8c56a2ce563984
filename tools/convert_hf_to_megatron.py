"""Convert a Hugging Face safetensors model to a Megatron torch_dist checkpoint (CPU, streaming).

The output is a checkpoint root that slime's `--load` / `--ref-load` read:
`latest_checkpointed_iteration.txt` ("release") and `release/` (torch DCP files, metadata.json,
common.pt). It is written under a temporary name and renamed when complete.

  python -m tools.convert_hf_to_megatron --hf-dir /models/Qwen3-8B --out /ckpt/Qwen3-8B_torch_dist
  python -m tools.convert_hf_to_megatron --hf-dir H --out D --tp 2 --dtype bf16

Supported: Qwen3ForCausalLM, Qwen2ForCausalLM (Qwen2.5), LlamaForCausalLM (Llama 3). See docs/CONVERT.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from krl_common.cli import make_parser
from slime_ext.convert import hf_to_megatron
from slime_ext.convert.cli import run_conversion
from slime_ext.convert.hf_io import DTYPES


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.convert_hf_to_megatron", __doc__)
    p.add_argument(
        "--hf-dir", type=Path, required=True, help="HF model directory (config.json + safetensors)"
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint root to create (must not exist)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size the vocab is padded for")
    p.add_argument(
        "--make-vocab-size-divisible-by",
        type=int,
        default=128,
        help="Megatron's flag of the same name; padding multiple = this x TP",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast weights (default: keep)")
    p.add_argument(
        "--iteration", type=int, default=None, help="write iter_XXXXXXX with this number instead of release/"
    )
    p.add_argument(
        "--no-te-extra-state",
        action="store_true",
        help="omit the Transformer Engine _extra_state objects (TE-spec models then need "
        "--dist-ckpt-strictness log_all to load)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    a = p.parse_args(argv)
    if a.tp < 1 or a.make_vocab_size_divisible_by < 1:
        p.error("--tp and --make-vocab-size-divisible-by must be >= 1")
    return run_conversion(
        a.out,
        lambda: hf_to_megatron(
            a.hf_dir,
            a.out,
            vocab_multiple=a.make_vocab_size_divisible_by * a.tp,
            tp=a.tp,
            dtype=DTYPES[a.dtype] if a.dtype else None,
            iteration=a.iteration,
            te_extra_state=not a.no_te_extra_state,
            overwrite=a.overwrite,
            progress=not a.no_progress,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
