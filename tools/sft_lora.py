"""LoRA / QLoRA SFT on one GPU (transformers + PEFT), for people without Megatron: reads our SFT
jsonl, trains the assistant turns, writes a merged HF checkpoint (docs/SFT_LORA.md).

  python -m tools.sft_lora --data data/sft.jsonl --model /ckpt/Qwen3-8B --out runs/sft-lora [--qlora]

Re-running with the same --out resumes from its newest checkpoint. Exit codes: 0 done, 2 bad
arguments or data.
"""

from __future__ import annotations

import argparse
import json
import sys

from krl_common.cli import make_parser
from slime_ext.sft.lora import DEFAULT_TARGETS, LoraSFTConfig, train


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("tools.sft_lora", __doc__)
    io = p.add_argument_group("data and model")
    io.add_argument("--data", required=True, help="SFT jsonl (messages; slime_ext/data/sft_format.py)")
    io.add_argument("--model", required=True, help="HF directory of the base model")
    io.add_argument("--out", required=True, help="output directory (checkpoints/, adapter/, merged/)")
    io.add_argument("--eval-data", help="held-out SFT jsonl (default: --eval-share of --data)")
    io.add_argument("--eval-share", type=float, default=0.05, help="held-out share of --data when no --eval-data")
    io.add_argument("--max-len", type=int, default=8192, help="longer conversations are skipped")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--epochs", type=float, default=1.0, help="passes over the training conversations")
    opt.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    opt.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (cosine decay to 10 %%)")
    opt.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps")
    opt.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    opt.add_argument("--grad-accum", type=int, default=8, help="conversations per optimizer step")
    opt.add_argument("--seed", type=int, default=0, help="data order, eval split and LoRA init")
    lora = p.add_argument_group("LoRA")
    lora.add_argument("--lora-r", type=int, default=16, help="LoRA rank")
    lora.add_argument("--lora-alpha", type=int, default=32, help="LoRA scale numerator (scale = alpha / r)")
    lora.add_argument("--lora-dropout", type=float, default=0.05, help="dropout on the LoRA input")
    lora.add_argument("--target-modules", default=",".join(DEFAULT_TARGETS), help="comma-separated module names that get a LoRA")
    lora.add_argument("--qlora", action="store_true", help="4-bit base weights (bitsandbytes, CUDA)")
    lora.add_argument("--dtype", default="bfloat16", help="base weights and the merged output")
    run = p.add_argument_group("run")
    run.add_argument("--log-every", type=int, default=10, help="progress line every N steps")
    run.add_argument("--eval-every", type=int, default=100, help="eval loss every N steps (and at the end)")
    run.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (and at the end)")
    run.add_argument("--adapter-only", action="store_true", help="write the adapter, not the merged model")
    run.add_argument("--device", help="default: cuda if available, else cpu")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = LoraSFTConfig(
            model=args.model, data=args.data, out=args.out, eval_data=args.eval_data,
            eval_share=args.eval_share, epochs=args.epochs, max_steps=args.max_steps, lr=args.lr,
            warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_accum=args.grad_accum,
            max_len=args.max_len, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout, target_modules=tuple(t for t in args.target_modules.split(",") if t),
            qlora=args.qlora, dtype=args.dtype, log_every=args.log_every, eval_every=args.eval_every,
            save_every=args.save_every, seed=args.seed, adapter_only=args.adapter_only, device=args.device,
        )  # fmt: skip
        summary = train(cfg, log=lambda line: print(line, flush=True))
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"sft_lora: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("steps", "final_eval_loss", "adapter", "merged")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
