"""Converter errors name what was wrong, and a failed run leaves no output that looks valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slime_ext.convert import ConvertError, hf_to_megatron, megatron_to_hf
from slime_ext.convert import convert as convert_mod
from slime_ext.convert.tiny_models import write_tiny_hf_model
from tools import convert_hf_to_megatron, convert_megatron_to_hf

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_hf_model(
        "qwen3", tmp_path_factory.mktemp("hf") / "m", torch.bfloat16, max_shard_size="100KB"
    )


@pytest.fixture(scope="module")
def mg_dir(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mg") / "ckpt"
    hf_to_megatron(hf_dir, out, progress=False)
    return out


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_unknown_architecture(tmp_path: Path, hf_dir: Path) -> None:
    bad = copy_model(hf_dir, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="unsupported architecture 'MistralForCausalLM'"):
        hf_to_megatron(bad, tmp_path / "out", progress=False)
    assert leftovers(tmp_path) == ["bad"]


def test_missing_config_and_weights(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConvertError, match="no config.json"):
        hf_to_megatron(tmp_path / "empty", tmp_path / "out", progress=False)


def test_missing_shard_and_missing_tensor(tmp_path: Path, hf_dir: Path) -> None:
    bad = copy_model(hf_dir, tmp_path / "bad")
    shard = sorted(bad.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ConvertError, match=f"missing: \\['{shard.name}'\\]"):
        hf_to_megatron(bad, tmp_path / "out", progress=False)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard.name}
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="tensors missing for Qwen3ForCausalLM"):
        hf_to_megatron(bad, tmp_path / "out", progress=False)
    assert leftovers(tmp_path) == ["bad"]


def test_shape_mismatch_in_both_directions(tmp_path: Path, hf_dir: Path, mg_dir: Path) -> None:
    bad = copy_model(hf_dir, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="gate_proj.weight.*expected|expected shape"):
        hf_to_megatron(bad, tmp_path / "out", progress=False)
    with pytest.raises(ConvertError, match="decoder.layers.mlp.linear_fc1.weight: checkpoint shape"):
        megatron_to_hf(mg_dir, tmp_path / "out", bad, progress=False)
    assert leftovers(tmp_path) == ["bad"]


def test_vocab_larger_than_checkpoint(tmp_path: Path, hf_dir: Path, mg_dir: Path) -> None:
    with pytest.raises(ConvertError, match="fewer than vocab_size 4096"):
        megatron_to_hf(mg_dir, tmp_path / "out", hf_dir, vocab_size=4096, progress=False)


def test_existing_output_is_refused(tmp_path: Path, hf_dir: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(ConvertError, match=r"already exists \(pass --overwrite to replace it\)"):
        hf_to_megatron(hf_dir, tmp_path / "out", progress=False)


@pytest.mark.parametrize("direction", ["hf_to_megatron", "megatron_to_hf"])
def test_failure_midway_leaves_nothing(
    tmp_path: Path, hf_dir: Path, mg_dir: Path, direction: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Die after some tensors were written: neither the output nor a partial directory remains."""
    calls = {"n": 0}
    name = "fill_megatron" if direction == "hf_to_megatron" else "to_hf"
    real = getattr(convert_mod, name)

    def dying(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full (simulated)")
        return real(*args)

    monkeypatch.setattr(convert_mod, name, dying)
    (tmp_path / "work").mkdir()
    with pytest.raises(OSError, match="simulated"):
        if direction == "hf_to_megatron":
            hf_to_megatron(hf_dir, tmp_path / "work" / "out", progress=False)
        else:
            megatron_to_hf(mg_dir, tmp_path / "work" / "out", hf_dir, progress=False)
    assert calls["n"] == 5
    assert leftovers(tmp_path / "work") == []


def test_not_a_checkpoint(tmp_path: Path, hf_dir: Path) -> None:
    with pytest.raises(ConvertError, match="not a torch_dist checkpoint"):
        megatron_to_hf(hf_dir, tmp_path / "out", hf_dir, progress=False)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "latest_checkpointed_iteration.txt").write_text("12")
    with pytest.raises(ConvertError, match="points to iter_0000012, which does not exist"):
        megatron_to_hf(tmp_path / "root", tmp_path / "out", hf_dir, progress=False)


def test_truncated_data_file(tmp_path: Path, hf_dir: Path, mg_dir: Path) -> None:
    bad = tmp_path / "bad"
    (bad / "release").mkdir(parents=True)
    for f in (mg_dir / "release").iterdir():
        (bad / "release" / f.name).write_bytes(f.read_bytes())
    (bad / "latest_checkpointed_iteration.txt").write_text("release")
    data = bad / "release" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(ConvertError, match="truncated"):
        megatron_to_hf(bad, tmp_path / "out", hf_dir, progress=False)
    assert leftovers(tmp_path) == ["bad"]


def test_clis_report_errors_and_succeed(
    tmp_path: Path, hf_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        convert_hf_to_megatron.main(
            ["--hf-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--no-progress"]
        )
        == 2
    )
    assert "no config.json" in capsys.readouterr().err
    assert (
        convert_hf_to_megatron.main(
            [
                "--hf-dir",
                str(hf_dir),
                "--out",
                str(tmp_path / "mg"),
                "--tp",
                "2",
                "--dtype",
                "fp32",
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        convert_megatron_to_hf.main(
            [
                "--input",
                str(tmp_path / "mg" / "release"),
                "--hf-config-dir",
                str(hf_dir),
                "--out",
                str(tmp_path / "hf"),
                "--dtype",
                "bf16",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "hf" / "model.safetensors").is_file()
