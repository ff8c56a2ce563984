"""Checkpoint conversion between Hugging Face safetensors and Megatron torch_dist (CPU, streaming).

See docs/CONVERT.md. Entry points: `hf_to_megatron`, `megatron_to_hf`, `megatron_args_from_hf_config`.

May import: nothing of this project.
"""

from slime_ext.convert.arch import ModelSpec, spec_from_hf_config
from slime_ext.convert.convert import ConvertStats, hf_to_megatron, megatron_to_hf
from slime_ext.convert.errors import ConvertError

__all__ = [
    "ConvertError",
    "ConvertStats",
    "ModelSpec",
    "hf_to_megatron",
    "megatron_to_hf",
    "spec_from_hf_config",
]
