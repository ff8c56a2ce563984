"""slime_ext/dev_engine/tiny_model.py: the model directory it writes loads back as the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_ext.dev_engine.tiny_model import (
    SIZES,
    build_model,
    main,
    tiny_model,
    tiny_tokenizer,
    write_model_dir,
)

pytestmark = pytest.mark.unit


def test_written_dir_loads_back_identically(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = write_model_dir(tmp_path / "m")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    tok = AutoTokenizer.from_pretrained(out)
    ref = tiny_tokenizer()
    text = "def forward(self, x):\n    return torch.relu(x)"
    assert tok.encode(text) == ref.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False
    ) == ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([ref.encode(text)])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, tiny_model()(input_ids=ids).logits, atol=1e-5)


def test_existing_dir_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(FileExistsError, match="exists"):
        write_model_dir(tmp_path / "m")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "m")])
    assert "exists" in capsys.readouterr().err


def test_default_size_is_unchanged() -> None:
    """The default size is still the original tiny model (configs/models/qwen3-tiny.sh, the CPU tests)."""
    cfg = tiny_model().config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (2, 64, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.vocab_size == 1200 and cfg.max_position_embeddings == 8192 and cfg.tie_word_embeddings
    assert sum(p.numel() for p in tiny_model().parameters()) == 150_912
    default, tiny = (
        build_model(tiny_tokenizer()).state_dict(),
        build_model(tiny_tokenizer(), size="tiny").state_dict(),
    )
    assert default.keys() == tiny.keys() and all(torch.equal(default[k], tiny[k]) for k in default)


def test_hd64_size_has_head_dim_64(tmp_path: Path, capsys) -> None:
    """--size hd64: head dim 64 (SGLang's attention kernels need 64 or 128), the same tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    assert set(SIZES) == {"tiny", "hd64"}
    assert main(["--out", str(tmp_path / "m"), "--size", "hd64"]) == 0
    assert "(size hd64)" in capsys.readouterr().out
    cfg = AutoConfig.from_pretrained(tmp_path / "m")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (4, 256, 768)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 64)
    assert cfg.vocab_size == 1200 and cfg.max_position_embeddings == 8192 and cfg.tie_word_embeddings
    text = "def forward(self, x):\n    return torch.relu(x)"
    assert AutoTokenizer.from_pretrained(tmp_path / "m").encode(text) == tiny_tokenizer().encode(text)


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown size 'big'"):
        write_model_dir(tmp_path / "m", size="big")
    assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "m"), "--size", "big"])
