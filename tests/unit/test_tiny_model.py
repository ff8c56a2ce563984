"""slime_ext/dev_engine/tiny_model.py: the model directory it writes loads back as the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_ext.dev_engine.tiny_model import main, tiny_model, tiny_tokenizer, write_model_dir

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
