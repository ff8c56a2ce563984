"""Megatron MODEL_ARGS from HF configs, and configs/models/*.sh kept in sync with the generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_ext.convert import ConvertError, spec_from_hf_config
from slime_ext.convert.megatron_args import megatron_args_from_hf_config
from tools import gen_model_args

pytestmark = pytest.mark.unit

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
EXPECTED_MODELS = {
    "qwen3-0.6B",
    "qwen3-1.7B",
    "qwen3-4B",
    "qwen3-8B",
    "qwen3-14B",
    "qwen3-32B",
    "qwen2.5-coder-1.5B",
    "qwen2.5-coder-7B",
    "llama3.1-8B",
    "qwen3-tiny",
    "qwen3-tiny-hd64",
}


def hf_config(name: str) -> dict:
    return json.loads((MODELS / "hf_configs" / f"{name}.json").read_text())


def flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def test_checked_in_files_match_the_generator() -> None:
    files = gen_model_args.expected_files(MODELS)
    assert {p.stem for p in files} == EXPECTED_MODELS
    for path, text in files.items():
        assert path.read_text() == text, f"{path} is stale: run python -m tools.gen_model_args --all"
    assert gen_model_args.main(["--all", "--check", "--models-dir", str(MODELS)]) == 0


@pytest.mark.parametrize(("size", "model"), [("tiny", "qwen3-tiny"), ("hd64", "qwen3-tiny-hd64")])
def test_tiny_model_args_match_the_model_tiny_model_writes(tmp_path: Path, size: str, model: str) -> None:
    """configs/models/qwen3-tiny.sh (PRESET=single_gpu_tiny TRAIN_ONLY=1) and qwen3-tiny-hd64.sh
    (PRESET=single_gpu_tiny with SGLang) have the flags of the model that
    `python -m slime_ext.dev_engine.tiny_model --size SIZE --out DIR` writes, so slime's config.json
    assertions hold."""
    pytest.importorskip("transformers")
    from slime_ext.dev_engine.tiny_model import write_model_dir

    written = json.loads((write_model_dir(tmp_path / size, size=size) / "config.json").read_text())
    assert megatron_args_from_hf_config(written) == megatron_args_from_hf_config(hf_config(model))
    # the checked-in config is the written one, reduced to the keys the other hf_configs keep
    rope_theta = written.get("rope_theta", (written.get("rope_parameters") or {}).get("rope_theta"))
    reduced = {**written, "rope_theta": rope_theta, "rope_scaling": written.get("rope_scaling")}
    assert {k: reduced[k] for k in hf_config(model)} == hf_config(model)


def test_check_detects_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / "hf_configs").mkdir()
    (tmp_path / "hf_configs" / "m.json").write_text(json.dumps(hf_config("qwen3-8B")))
    assert gen_model_args.main(["--all", "--check", "--models-dir", str(tmp_path)]) == 1
    assert gen_model_args.main(["--all", "--models-dir", str(tmp_path)]) == 0
    assert gen_model_args.main(["--all", "--check", "--models-dir", str(tmp_path)]) == 0
    (tmp_path / "m.sh").write_text((tmp_path / "m.sh").read_text().replace("36", "35"))
    assert gen_model_args.main(["--all", "--check", "--models-dir", str(tmp_path)]) == 1


def test_qwen3_8b_flags_match_slime_reference() -> None:
    """The flag values of slime's scripts/models/qwen3-8B.sh (see shared/slime_interfaces.md §6)."""
    f = flags(megatron_args_from_hf_config(hf_config("qwen3-8B")))
    assert f["--num-layers"] == "36" and f["--hidden-size"] == "4096" and f["--ffn-hidden-size"] == "12288"
    assert (
        f["--num-attention-heads"] == "32" and f["--num-query-groups"] == "8" and f["--kv-channels"] == "128"
    )
    assert f["--rotary-base"] == "1000000" and float(f["--norm-epsilon"]) == 1e-6
    assert f["--vocab-size"] == "151936" and f["--normalization"] == "RMSNorm"
    for flag in (
        "--swiglu",
        "--group-query-attention",
        "--qk-layernorm",
        "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",
        "--use-rotary-position-embeddings",
    ):
        assert flag in f
    assert "--add-qkv-bias" not in f


def test_family_specific_flags() -> None:
    tied = flags(megatron_args_from_hf_config(hf_config("qwen3-4B")))
    assert "--untie-embeddings-and-output-weights" not in tied and tied["--hidden-size"] == "2560"
    coder = flags(megatron_args_from_hf_config(hf_config("qwen2.5-coder-7B")))
    assert "--add-qkv-bias" in coder and "--qk-layernorm" not in coder and coder["--vocab-size"] == "152064"
    llama = flags(megatron_args_from_hf_config(hf_config("llama3.1-8B")))
    assert "--use-rope-scaling" in llama and float(llama["--rope-scaling-factor"]) == 8.0
    assert llama["--rotary-base"] == "500000" and float(llama["--norm-epsilon"]) == 1e-5


def test_transformers5_rope_parameters_and_errors() -> None:
    cfg = hf_config("qwen3-8B")
    cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000.0}
    assert spec_from_hf_config(cfg).rope_theta == 5e6
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
    with pytest.raises(ConvertError, match="rope scaling type 'yarn'"):
        spec_from_hf_config(cfg)
    llama = hf_config("llama3.1-8B")
    llama["rope_scaling"]["high_freq_factor"] = 2.0
    with pytest.raises(ConvertError, match="high_freq_factor"):
        megatron_args_from_hf_config(llama)
    with pytest.raises(ConvertError, match="unsupported architecture 'GPT2LMHeadModel'"):
        spec_from_hf_config({"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ConvertError, match="hidden_act 'gelu'"):
        spec_from_hf_config({**hf_config("qwen3-8B"), "hidden_act": "gelu"})
