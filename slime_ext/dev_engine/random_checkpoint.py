"""A randomly initialised HF checkpoint of a real architecture's shapes (e.g. Qwen3-8B, from
configs/models/hf_configs/): where weights cannot be downloaded, it is what makes a run meet the
default model's size (memory per GPU, weight pushes, checkpoint and conversion times, generation
at full response length). Not a model that writes kernels.

Weights: norms 1, every other tensor N(0, 0.02) in bf16, laid out from random offsets of one
256 MiB pool of draws (building 8 G fresh draws would take longer than writing the 16 GB), in
5 GB safetensors shards written streaming (slime_ext/convert/hf_io.py). Tokenizer: the bundled
byte-level BPE with Qwen3's special tokens and chat template (slime_ext/dev_engine/tiny_model.py),
padded with `<|extra_N|>` tokens to the config's vocabulary, so every id the model can sample
decodes. Written in a sibling temporary directory and renamed into place: complete or absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from slime_ext.convert.arch import hf_tensor_names, spec_from_hf_config
from slime_ext.convert.hf_io import SafetensorsWriter, TensorPlan
from slime_ext.convert.layout import atomic_output_dir

__all__ = ["hf_shapes", "write_random_checkpoint", "write_random_weights"]

POOL_ELEMS = 128 << 20  # 256 MiB of bf16
SHARD_BYTES = 5 * 10**9


def hf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of a Qwen3-style config, in the converter's order, with its shape."""
    s = spec_from_hf_config(config)
    h, d = s.hidden_size, s.head_dim
    per_layer = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (s.num_attention_heads * d, h),
        "self_attn.k_proj.weight": (s.num_query_groups * d, h),
        "self_attn.v_proj.weight": (s.num_query_groups * d, h),
        "self_attn.o_proj.weight": (h, s.num_attention_heads * d),
        "self_attn.q_norm.weight": (d,),
        "self_attn.k_norm.weight": (d,),
        "mlp.gate_proj.weight": (s.ffn_hidden_size, h),
        "mlp.up_proj.weight": (s.ffn_hidden_size, h),
        "mlp.down_proj.weight": (h, s.ffn_hidden_size),
    }
    shapes = {}
    for name in hf_tensor_names(s):
        if name.startswith("model.layers."):
            shapes[name] = per_layer[name.split(".", 3)[3]]
        else:
            shapes[name] = (s.vocab_size, h) if "embed" in name or "lm_head" in name else (h,)
    return shapes


def write_random_weights(
    out: Path, config: dict[str, Any], seed: int = 0, shard_bytes: int = SHARD_BYTES
) -> int:
    """The safetensors shards (and index) of `config`'s tensors into the existing `out`; returns bytes."""
    gen = torch.Generator().manual_seed(seed)
    pool = (torch.randn(POOL_ELEMS, generator=gen) * 0.02).to(torch.bfloat16)
    plan = [TensorPlan(n, torch.bfloat16, s) for n, s in hf_shapes(config).items()]
    writer = SafetensorsWriter(out, plan, shard_bytes)
    for t in plan:
        numel = int(torch.Size(t.shape).numel())
        if t.name.endswith("norm.weight"):
            writer.write(t.name, torch.ones(t.shape, dtype=torch.bfloat16))
            continue
        start = int(torch.randint(0, POOL_ELEMS, (1,), generator=gen))
        reps = -(-(start + numel) // POOL_ELEMS)
        src = pool.repeat(reps) if reps > 1 else pool
        writer.write(t.name, src[start : start + numel].reshape(t.shape))
        del src
    writer.close()
    return writer.total_bytes


def _tokenizer(vocab_size: int) -> Any:
    from slime_ext.dev_engine.tiny_model import build_tokenizer

    tok = build_tokenizer()
    if vocab_size < len(tok):
        raise ValueError(f"vocab_size {vocab_size} is below the bundled tokenizer's {len(tok)} tokens")
    tok.add_tokens([f"<|extra_{i}|>" for i in range(vocab_size - len(tok))])
    return tok


def write_random_checkpoint(
    out: str | os.PathLike[str], config: dict[str, Any], *, seed: int = 0, overwrite: bool = False
) -> int:
    """config.json, the tokenizer and random weights of `config` at `out`; returns the weights' bytes."""
    if Path(out).exists() and not overwrite:  # before the tokenizer is built
        raise FileExistsError(f"{out} exists (overwrite to replace it)")
    tok = _tokenizer(int(config["vocab_size"]))
    config = {
        **config,
        "torch_dtype": "bfloat16",
        "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
    }
    with atomic_output_dir(Path(out), overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tok.save_pretrained(tmp)
        nbytes = write_random_weights(tmp, config, seed)
    return nbytes
