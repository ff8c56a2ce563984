"""LoRA SFT without Megatron (slime_ext/sft, tools/sft_lora.py) on the CPU with the tiny local
Qwen3 model: the loss mask covers exactly the trained assistant turns, training lowers the loss on
the assistant tokens, the held-out eval loss is reported, a second run with the same --out resumes
from the newest checkpoint, and the merged output is a plain HF checkpoint (no LoRA weights) that
our converter takes and that computes what base + adapter compute."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from slime_ext.data.sft_format import SFTExample, assistant_message, write_sft_jsonl
from slime_ext.sft.masking import tokenize_conversation
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

ANSWERS = ["relu: tl.maximum(x, 0.0)", "softmax: tl.exp(x - m) / s", "sum: tl.sum(x, axis=0)"]


def _messages(i: int, code: str, failed_first: bool = False) -> list[dict]:
    msgs = [{"role": "system", "content": "You write Triton kernels."}, {"role": "user", "content": f"problem {i}"}]
    if failed_first:
        msgs += [assistant_message("broken(", trained=False), {"role": "user", "content": "SyntaxError: fix it"}]
    return [*msgs, assistant_message(code)]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its final norm's weight scaled up: with random weights the logits
    through the final RMSNorm and the tied embedding are near uniform whatever the layers do, and
    LoRA trains neither (it adapts the projections of a pretrained model, where they are not)."""
    d = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = copy.deepcopy(tiny_model())  # tiny_model() is one shared instance per process: never edit it
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    model.save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


def test_loss_mask_is_the_trained_assistant_turns() -> None:
    tok = tiny_tokenizer()
    ids, mask = tokenize_conversation(tok, _messages(0, ANSWERS[0], failed_first=True))
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert ANSWERS[0] in trained and "broken(" not in trained  # the failed attempt is context only
    assert "problem 0" not in trained and "You write Triton" not in trained and "SyntaxError" not in trained
    assert "<|im_start|>assistant" not in trained and trained.endswith("<|im_end|>\n")
    assert tok.decode(ids) == tok.apply_chat_template(_messages(0, ANSWERS[0], True), tokenize=False)


def test_train_resume_and_merge(base: Path, tmp_path: Path) -> None:
    from tools import sft_lora

    data = tmp_path / "sft.jsonl"
    write_sft_jsonl(data, [SFTExample(_messages(i, ANSWERS[i % 3], i % 4 == 0)) for i in range(24)])
    out = tmp_path / "run"
    common = ["--data", str(data), "--model", str(base), "--out", str(out), "--dtype", "float32",
              "--lr", "1e-2", "--grad-accum", "4", "--lora-r", "8", "--lora-alpha", "16",
              "--eval-share", "0.125",
              "--log-every", "1", "--eval-every", "3", "--save-every", "3", "--device", "cpu"]  # fmt: skip
    assert sft_lora.main([*common, "--max-steps", "8"]) == 0
    first = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == list(range(1, 9))
    assert first[-1]["loss"] < 0.6 * first[0]["loss"], first
    evals = [r["eval_loss"] for r in first if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < 0.7 * evals[0], evals  # steps 3, 6 and the last
    # the same --out with more steps: resumes at step 8 and trains 9-11 only
    assert sft_lora.main([*common, "--max-steps", "11"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == "step-8" and summary["steps"] == 11
    assert summary["data"] == {"train": 21, "eval": 3, "skipped": 0}
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-11", "step-9"]
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == [*range(1, 9), 9, 10, 11]

    # merged: a plain HF checkpoint equal to base + adapter
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    merged_dir = Path(summary["merged"])
    names = load_file(str(merged_dir / "model.safetensors")).keys()
    assert not any("lora" in n for n in names)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), summary["adapter"]
    ).eval()
    ids = torch.tensor([tokenize_conversation(tiny_tokenizer(), _messages(1, ANSWERS[1]))[0]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, with_adapter(ids).logits, atol=1e-4)
        assert not torch.allclose(
            merged(ids).logits, AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(ids).logits, atol=1e-3
        )
    # our HF -> Megatron converter takes it as it is (what slime's --load / --ref-load read)
    from tools import convert_hf_to_megatron

    dist = tmp_path / "merged_torch_dist"
    assert convert_hf_to_megatron.main(["--hf-dir", str(merged_dir), "--out", str(dist), "--no-progress"]) == 0
    assert (dist / "latest_checkpointed_iteration.txt").read_text().strip() == "release"


def test_bad_input_is_a_clear_error(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools import sft_lora

    missing = ["--data", str(tmp_path / "none.jsonl"), "--model", str(base), "--out", str(tmp_path / "o")]
    assert sft_lora.main(missing) == 2 and "SFT data not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert sft_lora.main(["--data", str(bad), "--model", str(base), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    qlora = ["--data", str(bad), "--model", str(base), "--out", str(tmp_path / "o"), "--qlora", "--device", "cpu"]
    assert sft_lora.main(qlora) == 2


def test_a_lora_on_a_tied_lm_head_is_refused(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools import sft_lora

    data = tmp_path / "sft.jsonl"
    write_sft_jsonl(data, [SFTExample(_messages(i, ANSWERS[0])) for i in range(3)])
    argv = ["--data", str(data), "--model", str(base), "--out", str(tmp_path / "o"), "--device", "cpu",
            "--target-modules", "q_proj,lm_head"]  # fmt: skip
    assert sft_lora.main(argv) == 2 and "lm_head is tied" in capsys.readouterr().err
