"""common.pt carries Megatron-style `args` (slime's convert_torch_dist_to_hf.py reads it): the values
match the HF config and the generated MODEL_ARGS flags, the pickle holds only builtins and
argparse.Namespace, and checkpoints whose args hold foreign classes (as slime's training saves them)
still convert back to HF."""

from __future__ import annotations

import argparse
import io
import pickle
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from slime_ext.convert import hf_to_megatron, megatron_to_hf
from slime_ext.convert.megatron_args import megatron_args_from_hf_config
from slime_ext.convert.tiny_models import TINY_KINDS, write_tiny_hf_model
from tools import convert_hf_to_megatron

pytestmark = pytest.mark.unit

# Flag of tools/gen_model_args -> (Namespace dest, how Megatron's parser types the value).
FLAG_DEST: dict[str, tuple[str, Any]] = {
    "--num-layers": ("num_layers", int),
    "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int),
    "--num-attention-heads": ("num_attention_heads", int),
    "--num-query-groups": ("num_query_groups", int),
    "--kv-channels": ("kv_channels", int),
    "--max-position-embeddings": ("max_position_embeddings", int),
    "--norm-epsilon": ("layernorm_epsilon", float),
    "--normalization": ("normalization", str),
    "--rotary-base": ("rotary_base", int),
    "--rope-scaling-factor": ("rope_scaling_factor", float),
    "--vocab-size": ("vocab_size", int),
}
SWITCH_DEST: dict[str, tuple[str, bool]] = {
    "--swiglu": ("swiglu", True),
    "--group-query-attention": ("group_query_attention", True),
    "--use-rotary-position-embeddings": ("use_rotary_position_embeddings", True),
    "--disable-bias-linear": ("add_bias_linear", False),
    "--add-qkv-bias": ("add_qkv_bias", True),
    "--qk-layernorm": ("qk_layernorm", True),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", True),
    "--use-rope-scaling": ("use_rope_scaling", True),
}


def load_common(ckpt: Path) -> dict[str, Any]:
    """As Megatron loads it once megatron-core registered its safe globals (Namespace among them)."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(ckpt / "common.pt", weights_only=True)


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_args_match_hf_config_and_model_flags(tmp_path: Path, kind: str) -> None:
    hf_dir = write_tiny_hf_model(kind, tmp_path / "hf", torch.float32)
    rc = convert_hf_to_megatron.main(
        ["--hf-dir", str(hf_dir), "--out", str(tmp_path / "mg"), "--tp", "2", "--no-progress"]
    )
    assert rc == 0
    common = load_common(tmp_path / "mg" / "release")
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 0)
    args = common["args"]
    assert isinstance(args, argparse.Namespace)

    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_dir)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert args.num_layers == cfg.num_hidden_layers
    assert args.hidden_size == cfg.hidden_size
    assert args.ffn_hidden_size == cfg.intermediate_size
    assert args.num_attention_heads == cfg.num_attention_heads
    assert args.num_query_groups == cfg.num_key_value_heads
    assert args.group_query_attention is (cfg.num_key_value_heads != cfg.num_attention_heads)
    assert args.kv_channels == head_dim
    assert args.max_position_embeddings == cfg.max_position_embeddings
    assert args.layernorm_epsilon == args.norm_epsilon == cfg.rms_norm_eps
    assert args.untie_embeddings_and_output_weights is (not cfg.tie_word_embeddings)
    assert args.add_qkv_bias is (kind == "qwen2")
    assert args.qk_layernorm is kind.startswith("qwen3")
    assert args.use_rope_scaling is (kind == "llama")
    assert (args.position_embedding_type, args.normalization, args.swiglu) == ("rope", "RMSNorm", True)
    assert args.add_bias_linear is False
    # vocabulary: HF size, padded to a multiple of 128 x TP as Megatron's _vocab_size_with_padding
    assert (args.vocab_size, args.padded_vocab_size, args.make_vocab_size_divisible_by) == (300, 512, 128)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (2, 1)
    assert args.ckpt_format == "torch_dist" and args.no_save_optim and args.no_save_rng
    # what slime's converter reads besides the architecture
    assert args.q_lora_rank is None and args.num_experts is None

    # Every flag tools/gen_model_args writes for this model is the value recorded under its dest.
    argv = megatron_args_from_hf_config(cfg.to_dict())
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in SWITCH_DEST:
            dest, value = SWITCH_DEST[flag]
            assert getattr(args, dest) is value, flag
            i += 1
        else:
            dest, typ = FLAG_DEST[flag]
            assert getattr(args, dest) == typ(argv[i + 1]), flag
            i += 2
    assert ("--group-query-attention" in argv) is args.group_query_attention


class _OnlyNamespace(pickle.Unpickler):
    """Refuses every class but argparse.Namespace, and any tensor storage."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("argparse", "Namespace"):
            return argparse.Namespace
        raise pickle.UnpicklingError(f"common.pt needs {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"common.pt holds a tensor storage {pid!r}")


def test_common_pt_pickle_needs_only_namespace(tmp_path: Path) -> None:
    hf_dir = write_tiny_hf_model("qwen3", tmp_path / "hf", torch.bfloat16)
    hf_to_megatron(hf_dir, tmp_path / "mg", progress=False)
    path = tmp_path / "mg" / "release" / "common.pt"
    with zipfile.ZipFile(path) as zf:
        (pkl,) = [n for n in zf.namelist() if n.endswith("/data.pkl")]
        common = _OnlyNamespace(io.BytesIO(zf.read(pkl))).load()
    builtins = (bool, int, float, str, type(None))
    assert all(isinstance(v, builtins) for v in vars(common["args"]).values())
    # torch.load: weights_only=False (Megatron's TorchCommonLoadStrategy, slime's converter) and
    # weights_only=True with Namespace allowed (megatron-core's register_safe_globals) agree.
    assert vars(torch.load(path, weights_only=False)["args"]) == vars(load_common(path.parent)["args"])
    with pytest.raises(pickle.UnpicklingError, match="Namespace"):
        torch.load(path, weights_only=True)  # without the safe global: refused, as for Megatron's own


def test_checkpoint_with_foreign_args_still_converts(tmp_path: Path) -> None:
    """slime's training saves Megatron's full args (enums and configs of megatron.core): our reader
    must not need common.pt, so such checkpoints convert where megatron is not installed."""
    hf_dir = write_tiny_hf_model("qwen3_tied", tmp_path / "hf", torch.bfloat16)
    hf_to_megatron(hf_dir, tmp_path / "mg", iteration=7, progress=False)
    ckpt = tmp_path / "mg" / "iter_0000007"
    mod = types.ModuleType("fake_megatron_enums")

    class AttnBackend:  # stands in for megatron.core.transformer.enums.AttnBackend
        pass

    AttnBackend.__module__ = mod.__name__
    AttnBackend.__qualname__ = "AttnBackend"
    mod.AttnBackend = AttnBackend  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        args = argparse.Namespace(num_layers=2, attention_backend=AttnBackend(), params_dtype=torch.bfloat16)
        torch.save(
            {"args": args, "checkpoint_version": 3.0, "iteration": 7, "rng_state": [{}]}, ckpt / "common.pt"
        )
    finally:
        del sys.modules[mod.__name__]
    with pytest.raises(ModuleNotFoundError):
        torch.load(ckpt / "common.pt", weights_only=False)  # unreadable here, like megatron's classes
    megatron_to_hf(tmp_path / "mg", tmp_path / "out", hf_dir, progress=False)
    want, got = load_file(hf_dir / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_tp_must_divide_the_padding_multiple(tmp_path: Path) -> None:
    """The recorded make_vocab_size_divisible_by is vocab_multiple / tp: refuse a tp that does not
    divide it rather than record a fraction."""
    from slime_ext.convert import ConvertError

    hf_dir = write_tiny_hf_model("qwen3", tmp_path / "hf", torch.bfloat16)
    with pytest.raises(ConvertError, match="not a multiple of tp 3"):
        hf_to_megatron(hf_dir, tmp_path / "mg", vocab_multiple=128, tp=3, progress=False)
    assert not (tmp_path / "mg").exists()
