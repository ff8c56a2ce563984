"""A tiny Qwen3-architecture model with a locally trained tokenizer: no download, ~1 s on a CPU.

Used by the CPU dry run (`python -m tools.dry_run`) and by the tests, wherever a real Hugging Face
causal LM directory is needed but no weights can be fetched. The weights are random (seeded), so
what the model writes is noise; the point is that every byte path (chat template, token ids,
log-probs, the `/generate` protocol, the trajectory records) is exercised for real.

- Tokenizer: byte-level BPE trained with `tokenizers` on the bundled sample problems and
  candidates plus the prompt templates, wrapped as a `PreTrainedTokenizerFast`, with the special
  tokens of Qwen3 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`) and a
  ChatML chat template written here in the style of Qwen3's: `<|im_start|>role\\n...<|im_end|>\\n`
  per message, `<|im_start|>assistant\\n` as generation prompt, an empty think block in the
  generation prompt when `enable_thinking=False`, the reasoning of assistant turns that precede
  the last user message removed, and assistant turns after it rendered with their think block
  (an empty one for the final turn), as Qwen3's template does; so, as with Qwen3, rendering
  `[user, assistant]` is not a prefix of rendering `[user, assistant, user]`.
- Model: `Qwen3ForCausalLM` with random weights (seeded), tied embeddings, 8192 positions, in one of
  the sizes of `SIZES`:
  - `tiny` (the default): 2 layers, hidden 64, 4 heads, 2 kv heads, head dim 16, intermediate 128
    (~0.15 M parameters). Its Megatron flags: configs/models/qwen3-tiny.sh.
  - `hd64`: 4 layers, hidden 256, 4 heads, 2 kv heads, head dim 64, intermediate 768 (~3.5 M
    parameters), for SGLang, whose attention kernels need head dim 64 or 128, and large enough to
    memorize a few ~1500-token answers in SFT. Its Megatron flags: configs/models/qwen3-tiny-hd64.sh.
  Both use the same tokenizer (vocab 1200).

CLI: `python -m slime_ext.dev_engine.tiny_model --out DIR [--size tiny|hd64]` writes a model
directory (config.json, model.safetensors, tokenizer files with the chat template) that
`AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(DIR)`, `python -m slime_ext.dev_engine.engine`
and (size hd64) SGLang load. The directory is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path
from typing import Any

from krl_common.cli import make_parser
from slime_ext.convert.layout import atomic_output_dir

__all__ = [
    "DEFAULT_SIZE",
    "SIZES",
    "SPECIAL_TOKENS",
    "TEMPLATE",
    "build_model",
    "build_tokenizer",
    "tiny_model",
    "tiny_tokenizer",
    "write_model_dir",
]

TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

DEFAULT_SEED = 1234

# Model sizes: name -> its Qwen3Config fields (the vocab size and the special
# token ids come from the tokenizer). `tiny` is what every caller got before sizes existed.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    # SGLang's attention kernels need head dim 64 or 128 (configs/run/presets/single_gpu_tiny.sh).
    "hd64": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
}
DEFAULT_SIZE = "tiny"


def _corpus() -> list[str]:
    from slime_ext.rollout import prompts

    texts = []
    for folder in ("problems", "candidates"):
        root = resources.files("eval_server.samples").joinpath(folder)
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py"):
                texts.append(entry.read_text(encoding="utf-8"))
    texts += [prompts.DEFAULT_SYSTEM, prompts.DEFAULT_INSTRUCTIONS, prompts.DEFAULT_EXAMPLE]
    texts += [
        prompts.DEFAULT_FIX_INSTRUCTION,
        prompts.DEFAULT_FASTER_INSTRUCTION,
        prompts.DEFAULT_NO_CODE_FEEDBACK,
    ]
    return texts


def build_tokenizer(vocab_size: int = 1200) -> Any:
    """Train the byte-level BPE tokenizer on the bundled corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    fast.chat_template = TEMPLATE
    return fast


def _size_fields(size: str) -> dict[str, Any]:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown size {size!r}: use one of {', '.join(SIZES)}") from None


def build_model(tokenizer: Any, seed: int = DEFAULT_SEED, size: str = DEFAULT_SIZE) -> Any:
    """A random-weight Qwen3ForCausalLM of `size` (a key of SIZES) for the tokenizer (float32, eval mode)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        **_size_fields(size),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float().eval()


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    """The tokenizer, built once per process."""
    return build_tokenizer()


@functools.lru_cache(maxsize=1)
def tiny_model() -> Any:
    """The model (size tiny, seed 1234), built once per process."""
    return build_model(tiny_tokenizer())


def write_model_dir(
    out: str | os.PathLike[str],
    *,
    seed: int = DEFAULT_SEED,
    overwrite: bool = False,
    size: str = DEFAULT_SIZE,
) -> Path:
    """Write a loadable HF model directory (config, safetensors, tokenizer + chat template) of `size`.

    Built in a sibling temporary directory and renamed into place, so `out` is either complete
    or absent. An existing `out` is an error unless `overwrite`.
    """
    _size_fields(size)  # an unknown size fails before anything is built or written
    target = Path(out)
    if target.exists() and not overwrite:  # before the build, which takes a while
        raise FileExistsError(f"{target} exists (pass overwrite=True / --overwrite to replace it)")
    tok = build_tokenizer()
    model = build_model(tok, seed=seed, size=size)
    with atomic_output_dir(target, overwrite=True) as tmp:  # existence checked above
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return target


def main(argv: list[str] | None = None) -> int:
    p = make_parser("slime_ext.dev_engine.tiny_model", __doc__)
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="weight seed")
    p.add_argument(
        "--size",
        choices=list(SIZES),
        default=DEFAULT_SIZE,
        help="model size: tiny (head dim 16) or hd64 (head dim 64, servable by SGLang)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    args = p.parse_args(argv)
    try:
        path = write_model_dir(args.out, seed=args.seed, overwrite=args.overwrite, size=args.size)
    except FileExistsError as exc:
        p.error(str(exc))
    size_note = "" if args.size == DEFAULT_SIZE else f" (size {args.size})"
    print(f"tiny model written to {path}{size_note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
