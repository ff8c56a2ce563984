"""tools.build_random_checkpoint: a random checkpoint of a real architecture's shapes that
transformers loads and runs, whose tokenizer decodes every id the model can sample, and that our
converter takes to torch_dist (on the tiny shapes; the Qwen3-8B plan is checked by its size)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime_ext.dev_engine.random_checkpoint import hf_shapes, write_random_checkpoint
from tools import build_random_checkpoint as cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "models" / "hf_configs"


def test_the_qwen3_8b_plan_has_the_models_parameter_count() -> None:
    shapes = hf_shapes(json.loads((CONFIGS / "qwen3-8B.json").read_text()))
    assert sum(math.prod(s) for s in shapes.values()) == 8_190_735_360  # Qwen3-8B: 8.2 B, 16.4 GB bf16
    assert shapes["model.embed_tokens.weight"] == (151936, 4096) and "lm_head.weight" in shapes


def test_a_built_checkpoint_loads_generates_decodes_and_converts(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = {**json.loads((CONFIGS / "qwen3-tiny-hd64.json").read_text()), "vocab_size": 2000}
    out = tmp_path / "hf"
    nbytes = write_random_checkpoint(out, config, seed=3)
    assert nbytes == 2 * sum(math.prod(s) for s in hf_shapes(config).values())
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 2000  # padded to the model's vocabulary: every sampled id decodes
    assert tok.decode([1999]) == "<|extra_799|>"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>assistant" in chat
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    ids = tok(chat, return_tensors="pt")["input_ids"]
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] == ids.shape[1] + 4 and tok.decode(gen[0, ids.shape[1] :])
    with pytest.raises(FileExistsError):
        write_random_checkpoint(out, config)
    conv = subprocess.run(
        [sys.executable, "-m", "tools.convert_hf_to_megatron", "--hf-dir", str(out), "--out", str(tmp_path / "td")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert conv.returncode == 0, conv.stderr[-2000:]


def test_cli_builds_a_model_and_refuses_what_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    assert cli.main(["--model", "qwen3-tiny-hd64", "--out", str(out), "--layers", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert "1 layers, vocab 1200" in capsys.readouterr().out
    assert cli.main(["--model", "qwen3-tiny-hd64", "--out", str(out)]) == 2  # exists
    assert cli.main(["--model", "nosuch", "--out", str(tmp_path / "x")]) == 2
    assert cli.main(["--model", "llama3.1-8B", "--out", str(tmp_path / "x")]) == 2
    assert cli.main(["--model", "qwen3-8B", "--out", str(tmp_path / "x"), "--layers", "0"]) == 2
    err = capsys.readouterr().err
    assert "unknown --model 'nosuch'" in err and "only qwen3 shapes" in err and "--layers 0" in err
    assert not (tmp_path / "x").exists()
