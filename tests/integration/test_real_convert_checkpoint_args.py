"""Our torch_dist output through upstream's REAL readers of common.pt `args` (sources from
scripts/fetch_upstream.sh, or SLIME_SRC / MEGATRON_SRC; skipped without them):

- slime's `tools/convert_torch_dist_to_hf.py` (what slime users reach for first, which failed with
  `KeyError: 'args'` before common.pt had them) turns the checkpoint back into the original HF
  tensors, loaded with transformers;
- Megatron-LM's `load_args_from_checkpoint` (`--use-checkpoint-args`) takes every model field from
  common.pt, equal to what Megatron's parser makes of the generated MODEL_ARGS flags.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime_ext.convert.megatron_args import megatron_args_from_hf_config
from slime_ext.convert.tiny_models import write_tiny_hf_model
from tests.real_slime import megatron_src, missing_source_reason, slime_src
from tools import convert_hf_to_megatron

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VOCAB = 300  # tiny_models' vocabulary, not a multiple of 128: padding is cut back


def _convert(tmp_path: Path, kind: str, dtype: torch.dtype, tp: int) -> tuple[Path, Path]:
    hf_dir = write_tiny_hf_model(kind, tmp_path / "hf", dtype)
    root = tmp_path / "mg"
    argv = ["--hf-dir", str(hf_dir), "--out", str(root), "--tp", str(tp), "--no-progress"]
    assert convert_hf_to_megatron.main(argv) == 0
    return hf_dir, root


def _missing_third_party(stderr: str) -> str | None:
    """A module slime's tool imports that is not installed here (not slime's own)."""
    m = re.search(r"ModuleNotFoundError: No module named '([^']+)'", stderr)
    if m and not m.group(1).startswith(("slime", "tools", "tests")):
        return m.group(1)
    return None


CASES = [
    ("qwen3", torch.bfloat16, 1),
    ("qwen3_tied", torch.float32, 2),
    ("qwen2", torch.bfloat16, 1),
    ("llama", torch.bfloat16, 4),
]


@pytest.mark.parametrize("kind,dtype,tp", CASES, ids=[f"{k}-{str(d)[6:]}-tp{t}" for k, d, t in CASES])
def test_slime_convert_torch_dist_to_hf_reads_our_checkpoint(
    tmp_path: Path, kind: str, dtype: torch.dtype, tp: int
) -> None:
    reason = missing_source_reason()
    if reason:
        pytest.skip(reason)
    hf_dir, root = _convert(tmp_path, kind, dtype, tp)
    out = tmp_path / "slime_hf"
    cmd = [
        sys.executable,
        str(slime_src() / "tools" / "convert_torch_dist_to_hf.py"),
        "--input-dir", str(root / "release"),
        "--output-dir", str(out),
        "--origin-hf-dir", str(hf_dir),
        "--vocab-size", str(VOCAB),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(slime_src()), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    missing = _missing_third_party(proc.stderr)
    if proc.returncode != 0 and missing:
        pytest.skip(f"slime's convert_torch_dist_to_hf.py imports {missing!r}, not installed here")
    assert proc.returncode == 0, proc.stderr[-4000:]

    from transformers import AutoModelForCausalLM

    want = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).state_dict()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    got = model.state_dict()
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert got[name].dtype == dtype and torch.equal(got[name], tensor), name
    assert model.get_input_embeddings().weight.shape[0] == VOCAB  # padding rows were removed


def test_megatron_load_args_from_checkpoint_reads_our_args(tmp_path: Path) -> None:
    reason = missing_source_reason(megatron=True)
    if reason:
        pytest.skip(reason)
    hf_dir, root = _convert(tmp_path, "qwen3", torch.bfloat16, tp=2)
    flags = megatron_args_from_hf_config(json.loads((hf_dir / "config.json").read_text()))
    report_path = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{megatron_src()}", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.real_megatron_load_args", str(report_path), str(root), "--",
         *flags, "--tensor-model-parallel-size", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    missing = _missing_third_party(proc.stderr)
    if proc.returncode != 0 and missing and not missing.startswith("megatron"):
        pytest.skip(f"Megatron-LM's checkpointing imports {missing!r}, not installed here")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(report_path.read_text())
    loaded, ckpt, parsed, log = report["loaded"], report["checkpoint_args"], report["flags"], report["log"]
    assert ckpt is not None, "load_args_from_checkpoint found no args in common.pt"
    assert "does not have arguments saved" not in log

    # The architecture a run gets from the checkpoint alone is the one its MODEL_ARGS flags give.
    from_checkpoint = [
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
        "group_query_attention", "kv_channels", "max_position_embeddings", "position_embedding_type",
        "add_position_embedding", "use_rotary_position_embeddings", "rotary_base", "rotary_percent",
        "rotary_interleaved", "add_bias_linear", "add_qkv_bias", "squared_relu", "swiglu",
        "untie_embeddings_and_output_weights", "normalization", "apply_query_key_layer_scaling",
        "num_experts", "tensor_model_parallel_size", "pipeline_model_parallel_size",
        "expert_model_parallel_size", "ckpt_format",
    ]  # fmt: skip
    for name in from_checkpoint:
        if ckpt[name] is not None:  # Megatron treats None (num_experts of a dense model) as absent
            assert f"Checkpoint did not provide arguments {name}\n" not in log, name
        assert loaded[name] == parsed[name], (name, loaded[name], parsed[name])
    assert loaded["padded_vocab_size"] == 512 and loaded["iteration"] == 0  # 300 -> 128 x TP 2

    # Every field we write under a Megatron dest holds the value Megatron's parser gives that dest
    # for these flags (so the names are Megatron's), except those no model flag sets.
    not_from_flags = {
        "num_query_groups",  # parser default 1 without GQA; the tiny model is GQA, checked above
        "padded_vocab_size", "consumed_train_samples", "skipped_train_samples",
        "consumed_valid_samples",  # set at run time, not parsed
        "attention_dropout", "hidden_dropout",  # 0.0 for HF models; Megatron's flag default is 0.1
        "no_save_optim", "no_save_rng",  # this checkpoint has neither
        "norm_epsilon", "apply_layernorm_1p",  # older dest names, kept for older readers
    }  # fmt: skip
    for name, value in ckpt.items():
        if name in parsed and name not in not_from_flags:
            assert value == parsed[name], (name, value, parsed[name])
    legacy = {"norm_epsilon", "apply_layernorm_1p", "padded_vocab_size"} | {
        "consumed_train_samples", "skipped_train_samples", "consumed_valid_samples",
        "virtual_pipeline_model_parallel_size",  # set by validate_args, read back by load_args
    }  # fmt: skip
    unknown = set(ckpt) - set(parsed) - legacy
    assert not unknown, f"fields Megatron's parser does not define: {sorted(unknown)}"
    assert ckpt["norm_epsilon"] == parsed["layernorm_epsilon"]
