"""Tiny random HF models of each supported architecture, written with transformers'
`save_pretrained` (safetensors), for the converter round-trip tests and the GPU logits check.

Shapes are small but keep every structural feature: GQA (heads != kv heads), head_dim != hidden /
heads for Qwen3, a vocabulary that is not a multiple of 128 (so padding is exercised), qkv bias for
Qwen2, llama3 rope scaling for Llama, tied and untied embeddings.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["TINY_KINDS", "tiny_hf_config", "write_tiny_hf_model"]

TINY_KINDS = ("qwen3", "qwen3_tied", "qwen2", "llama")


def tiny_hf_config(kind: str, vocab_size: int = 300, num_layers: int = 2):  # -> PretrainedConfig
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    if kind in ("qwen3", "qwen3_tied"):
        cfg = Qwen3Config(
            **common, head_dim=32, tie_word_embeddings=kind == "qwen3_tied", rope_theta=1000000.0
        )
    elif kind == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=False, rope_theta=1000000.0)
    elif kind == "llama":
        # max_position_embeddings above the llama3 original context (8192), as transformers requires.
        cfg = LlamaConfig(
            **{**common, "max_position_embeddings": 16384},
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose from {TINY_KINDS}")
    return cfg


def write_tiny_hf_model(
    kind: str,
    out_dir: Path,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    max_shard_size: str | None = None,
    vocab_size: int = 300,
    num_layers: int = 2,
) -> Path:
    """Save a seeded random model; every weight (norms and biases too) is random so a misplaced
    tensor cannot go unnoticed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_hf_config(kind, vocab_size, num_layers)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.05)
    model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    return Path(out_dir)
