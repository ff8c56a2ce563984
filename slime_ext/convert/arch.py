"""Supported Hugging Face architectures and their Megatron (TE layer spec) tensor map.

One `ModelSpec` is read from an HF `config.json`; `megatron_tensors(spec, padded_vocab)` lists
every tensor of the Megatron torch_dist checkpoint with the HF tensors it is made of. Per-layer
tensors use the default (homogeneous) sharded-state-dict layout of megatron-core: one tensor per
name under `decoder.layers.`, with the layer index as a prepended axis 0 of the global shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from slime_ext.convert.errors import ConvertError
from slime_ext.convert.qkv import RowPiece, gate_up_row_pieces, qkv_row_pieces, split_gate_up, split_qkv

__all__ = [
    "ARCHITECTURES",
    "ModelSpec",
    "MegatronTensor",
    "fill_megatron",
    "hf_part_shapes",
    "hf_tensor_names",
    "row_pieces",
    "megatron_tensors",
    "padded_vocab_size",
    "spec_from_hf_config",
    "te_extra_state_keys",
    "to_hf",
    "to_megatron",
]

# HF class name -> (family, qkv bias, q/k layernorm). Anything else is rejected by name.
ARCHITECTURES: dict[str, tuple[str, bool, bool]] = {
    "Qwen3ForCausalLM": ("qwen3", False, True),
    "Qwen2ForCausalLM": ("qwen2", True, False),
    "LlamaForCausalLM": ("llama", False, False),
}

LAYER = "{layer}"


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the name map and the Megatron flags need."""

    architecture: str
    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    norm_epsilon: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: Mapping[str, Any] | None = None


def _rope(config: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None]:
    """rope_theta and the scaling dict from either transformers 4 (`rope_theta`, `rope_scaling`) or
    transformers 5 (`rope_parameters`) style configs."""
    params = config.get("rope_parameters")
    theta = config.get("rope_theta")
    scaling = config.get("rope_scaling")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", "default") != "default":
            scaling = params
    if theta is None:
        theta = 10000.0
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            scaling = None
        elif kind != "llama3":
            raise ConvertError(f"rope scaling type {kind!r} is not supported (only 'llama3')")
    return float(theta), scaling


def _require(config: Mapping[str, Any], key: str) -> Any:
    if key not in config or config[key] is None:
        raise ConvertError(f"config.json has no {key!r}")
    return config[key]


def spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """Validate a config.json dict and return its ModelSpec; unknown or unsupported settings raise."""
    archs = config.get("architectures") or []
    if len(archs) != 1:
        raise ConvertError(f"config.json must name exactly one architecture, got {archs!r}")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ConvertError(
            f"unsupported architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    family, qkv_bias, qk_norm = ARCHITECTURES[arch]
    if config.get("hidden_act", "silu") != "silu":
        raise ConvertError(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    if family == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ConvertError("Llama with attention_bias or mlp_bias is not supported")
    if family == "qwen3" and config.get("attention_bias"):
        raise ConvertError("Qwen3 with attention_bias is not supported")
    if config.get("use_sliding_window"):
        raise ConvertError("sliding-window attention is not supported")
    heads = int(_require(config, "num_attention_heads"))
    hidden = int(_require(config, "hidden_size"))
    groups = int(config.get("num_key_value_heads") or heads)
    if heads % groups:
        raise ConvertError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
    head_dim = config.get("head_dim") or hidden // heads
    theta, scaling = _rope(config)
    eps = config.get("rms_norm_eps")
    if eps is None:
        raise ConvertError("config.json has no 'rms_norm_eps'")
    return ModelSpec(
        architecture=arch,
        family=family,
        num_layers=int(_require(config, "num_hidden_layers")),
        hidden_size=hidden,
        ffn_hidden_size=int(_require(config, "intermediate_size")),
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=int(head_dim),
        vocab_size=int(_require(config, "vocab_size")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_layernorm=qk_norm,
        norm_epsilon=float(eps),
        rope_theta=theta,
        max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
        rope_scaling=dict(scaling) if scaling is not None else None,
    )


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
    if multiple < 1:
        raise ConvertError(f"vocab padding multiple must be >= 1, got {multiple}")
    return int(math.ceil(vocab_size / multiple) * multiple)


@dataclass(frozen=True)
class MegatronTensor:
    """One tensor of the Megatron checkpoint and the HF tensors it is made of.

    `shape` is the Megatron shape of one layer's slice for per-layer tensors (the global shape is
    `(num_layers, *shape)`), else the global shape. `kind`: copy | qkv | gate_up | vocab."""

    key: str
    hf_names: tuple[str, ...]
    kind: str
    shape: tuple[int, ...]
    per_layer: bool

    def global_shape(self, num_layers: int) -> tuple[int, ...]:
        return (num_layers, *self.shape) if self.per_layer else self.shape

    def hf_for_layer(self, layer: int | None) -> tuple[str, ...]:
        return tuple(n.replace(LAYER, str(layer)) for n in self.hf_names)


def megatron_tensors(spec: ModelSpec, padded_vocab: int) -> list[MegatronTensor]:
    """Every model tensor of the checkpoint, in the order the converters write them."""
    h, d, g, f = spec.hidden_size, spec.head_dim, spec.num_query_groups, spec.ffn_hidden_size
    qkv_rows = (spec.num_attention_heads + 2 * g) * d
    hl = f"model.layers.{LAYER}."
    out = [
        MegatronTensor(
            "embedding.word_embeddings.weight",
            ("model.embed_tokens.weight",),
            "vocab",
            (padded_vocab, h),
            False,
        )
    ]
    layer = [
        ("self_attention.linear_qkv.layer_norm_weight", ("input_layernorm.weight",), "copy", (h,)),
        (
            "self_attention.linear_qkv.weight",
            tuple(f"self_attn.{p}_proj.weight" for p in "qkv"),
            "qkv",
            (qkv_rows, h),
        ),
    ]
    if spec.qkv_bias:
        layer.append(
            (
                "self_attention.linear_qkv.bias",
                tuple(f"self_attn.{p}_proj.bias" for p in "qkv"),
                "qkv",
                (qkv_rows,),
            )
        )
    if spec.qk_layernorm:
        layer += [
            ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), "copy", (d,)),
            ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), "copy", (d,)),
        ]
    layer += [
        (
            "self_attention.linear_proj.weight",
            ("self_attn.o_proj.weight",),
            "copy",
            (h, spec.num_attention_heads * d),
        ),
        ("mlp.linear_fc1.layer_norm_weight", ("post_attention_layernorm.weight",), "copy", (h,)),
        ("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up", (2 * f, h)),
        ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "copy", (h, f)),
    ]
    out += [
        MegatronTensor(f"decoder.layers.{k}", tuple(hl + n for n in names), kind, shape, True)
        for k, names, kind, shape in layer
    ]
    out.append(MegatronTensor("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", (h,), False))
    if not spec.tie_word_embeddings:
        out.append(
            MegatronTensor("output_layer.weight", ("lm_head.weight",), "vocab", (padded_vocab, h), False)
        )
    return out


def te_extra_state_keys(spec: ModelSpec) -> list[tuple[str, bool]]:
    """(key, per_layer) of the Transformer Engine `_extra_state` objects a TE-spec GPTModel asks for
    when it loads (ShardedObjects; a model without TE ignores them as unexpected keys)."""
    names = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]
    if spec.qk_layernorm:
        names += ["self_attention.q_layernorm", "self_attention.k_layernorm"]
    keys = [(f"decoder.layers.{n}._extra_state", True) for n in names]
    keys.append(("decoder.final_layernorm._extra_state", False))
    return keys


def hf_tensor_names(spec: ModelSpec) -> list[str]:
    """All HF tensor names a full checkpoint of this spec holds, layer by layer."""
    names: list[str] = []
    tensors = megatron_tensors(spec, spec.vocab_size)
    names += [n for t in tensors if not t.per_layer and t.key.startswith("embedding") for n in t.hf_names]
    for layer in range(spec.num_layers):
        names += [n for t in tensors if t.per_layer for n in t.hf_for_layer(layer)]
    names += [n for t in tensors if not t.per_layer and not t.key.startswith("embedding") for n in t.hf_names]
    return names


def row_pieces(spec: ModelSpec, mt: MegatronTensor) -> list[RowPiece]:
    """Where each HF part's rows go in the Megatron tensor (rows not covered are vocab padding)."""
    if mt.kind == "qkv":
        return qkv_row_pieces(spec.num_attention_heads, spec.num_query_groups, spec.head_dim)
    if mt.kind == "gate_up":
        return gate_up_row_pieces(spec.ffn_hidden_size)
    rows = spec.vocab_size if mt.kind == "vocab" else mt.shape[0]
    return [(0, 0, rows, 0)]


def hf_part_shapes(spec: ModelSpec, mt: MegatronTensor) -> list[tuple[int, ...]]:
    """The shape of each HF tensor in `mt.hf_names` order."""
    pieces = row_pieces(spec, mt)
    return [
        (sum(rows for p, _, rows, _ in pieces if p == part), *mt.shape[1:])
        for part in range(len(mt.hf_names))
    ]


def fill_megatron(
    spec: ModelSpec,
    mt: MegatronTensor,
    out: torch.Tensor,
    read_rows: Callable[[int, int, torch.Tensor], None],
) -> torch.Tensor:
    """Fill `out` (one layer's Megatron tensor) piece by piece; `read_rows(part, first_row, dest)`
    fills the contiguous `dest` with rows of HF part `part`. Padding rows are zeroed, as
    Megatron initialises them for loading. Lets the converter read straight from the file into
    a reused buffer: no intermediate tensors, no fresh pages per layer."""
    if tuple(out.shape) != mt.shape:
        raise ConvertError(f"{mt.key}: buffer shape {tuple(out.shape)}, expected {mt.shape}")
    covered = 0
    for part, src, rows, dst in row_pieces(spec, mt):
        read_rows(part, src, out[dst : dst + rows])
        covered += rows
    if covered < mt.shape[0]:
        out[covered:].zero_()
    return out


def to_megatron(spec: ModelSpec, mt: MegatronTensor, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Build one Megatron tensor (one layer's slice for per-layer tensors) from in-memory HF parts."""
    for name, part, shape in zip(mt.hf_names, parts, hf_part_shapes(spec, mt), strict=True):
        if tuple(part.shape) != shape:
            raise ConvertError(f"{name}: expected shape {shape}, got {tuple(part.shape)}")
    if mt.kind == "copy":
        return parts[0]
    out = torch.empty(mt.shape, dtype=parts[0].dtype)
    return fill_megatron(
        spec, mt, out, lambda part, src, dest: dest.copy_(parts[part][src : src + len(dest)])
    )


def to_hf(spec: ModelSpec, mt: MegatronTensor, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Split one Megatron tensor (one layer's slice) into its HF tensors, in `mt.hf_names` order."""
    if tuple(tensor.shape) != mt.shape:
        raise ConvertError(f"{mt.key}: checkpoint shape {tuple(tensor.shape)}, expected {mt.shape}")
    if mt.kind == "qkv":
        return list(split_qkv(tensor, spec.num_attention_heads, spec.num_query_groups, spec.head_dim))
    if mt.kind == "gate_up":
        return list(split_gate_up(tensor))
    if mt.kind == "vocab":
        return [tensor[: spec.vocab_size]]
    return [tensor]
