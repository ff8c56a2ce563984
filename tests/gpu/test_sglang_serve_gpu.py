"""SGLang serves our tiny model token in / token out, with log-probs a transformers forward agrees
with, and takes new weights (issue 28 item 1).

What runs: the tiny Qwen3 at head dim 64 (`slime_ext.dev_engine.tiny_model --size hd64`: SGLang's
attention kernels need 64 or 128) written to a temporary directory, `python -m
sglang.launch_server` on GPU 0 with the triton attention backend (the staged sglang-kernel may be
trimmed of FlashAttention-3: scripts/gpu_env/stage.sh trim), then:

1. `/generate` with `input_ids` (a sample problem's prompt as the episode renders it) and
   `return_logprob`: the reply's `output_token_logprobs` ids are the tokens, their log-probs match
   a transformers forward of prompt + output (float32, same weights) within bf16 tolerance, and
   the prompt's `input_token_logprobs` (from `logprob_start_len` 0) match too.
2. `/update_weights_from_disk` with a model of other weights: the log-probs of the same fixed
   sequence move, and match the new model's forward (SGLang really serves what it was given).

Needs sglang importable (scripts/gpu_env/trainer.lock, docs/GPU_TESTS.md "A bare GPU machine").
`KRL_GPU_ARTIFACTS=DIR` keeps the server log and a JSON summary there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gpu.launched import artifacts, sglang_server

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("sglang", reason="needs sglang (scripts/gpu_env/trainer.lock)")

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("KRL_SGLANG_START_TIMEOUT_S", "600"))
ATTENTION_BACKEND = os.environ.get("KRL_SGLANG_ATTENTION_BACKEND", "triton")
# bf16 serving vs a float32 forward of the same weights (per-token log-prob, nats).
MEAN_TOL = 0.05
MAX_TOL = 0.3
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from slime_ext.dev_engine.tiny_model import write_model_dir

    root = tmp_path_factory.mktemp("sglang_models")
    return {
        "a": write_model_dir(root / "hd64-a", size="hd64", seed=1234),
        "b": write_model_dir(root / "hd64-b", size="hd64", seed=4321),
    }


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_path = tmp_path_factory.mktemp("sglang_log") / "sglang.log"
    with sglang_server(
        models["a"],
        log_path,
        attention_backend=ATTENTION_BACKEND,
        start_timeout_s=START_TIMEOUT_S,
        keep_log_as="sglang_serve.log",
    ) as url:
        yield url


def _prompt_ids(model_dir: Path) -> list[int]:
    """A sample problem's first-turn prompt, rendered as the episode renders it."""
    from transformers import AutoTokenizer

    from eval_server import samples
    from slime_ext.rollout.prompts import build_messages

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = build_messages(samples.load_problem("relu"))
    return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def _forward_logprobs(model_dir: Path, ids: list[int]) -> Any:
    """log p(ids[i] | ids[:i]) for i >= 1 from a float32 transformers forward on the GPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:], device="cuda")[:, None])[:, 0]
    del model
    torch.cuda.empty_cache()
    return lp.cpu()


def _generate(url: str, ids: list[int], **extra: Any) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": NEW_TOKENS, "no_stop_trim": True,
                            "skip_special_tokens": False, "ignore_eos": True},
        "return_logprob": True,
        **extra,
    }  # fmt: skip
    resp = httpx.post(f"{url}/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _diff(served: list[float], reference: Any) -> dict[str, float]:
    d = (torch.tensor(served) - reference).abs()
    return {"mean": float(d.mean()), "max": float(d.max()), "n": len(served)}


def test_generate_token_in_token_out_logprobs_match_transformers(
    server: str, models: dict[str, Path]
) -> None:
    ids = _prompt_ids(models["a"])
    res = _generate(server, ids, logprob_start_len=0)
    meta = res["meta_info"]
    out = meta["output_token_logprobs"]
    out_ids = [int(t[1]) for t in out]
    assert len(out_ids) == NEW_TOKENS and meta["finish_reason"]["type"] == "length", meta["finish_reason"]
    ref = _forward_logprobs(models["a"], ids + out_ids)
    gen = _diff([float(t[0]) for t in out], ref[len(ids) - 1 :])
    prompt_lps = [float(t[0]) for t in meta["input_token_logprobs"][1:]]  # the first token has none
    prompt = _diff(prompt_lps, ref[: len(ids) - 1])
    summary = {"prompt_tokens": len(ids), "generated": gen, "prompt": prompt, "model": "hd64-a"}
    if (art := artifacts()) is not None:
        art.mkdir(parents=True, exist_ok=True)
        (art / "sglang_logprobs.json").write_text(json.dumps(summary, indent=1))
    print("sglang vs transformers log-probs:", json.dumps(summary))
    assert gen["mean"] <= MEAN_TOL and gen["max"] <= MAX_TOL, summary
    assert prompt["mean"] <= MEAN_TOL and prompt["max"] <= MAX_TOL, summary


def test_new_weights_change_what_sglang_serves(server: str, models: dict[str, Path]) -> None:
    ids = _prompt_ids(models["a"])
    first = _generate(server, ids, logprob_start_len=0)
    seq = ids + [int(t[1]) for t in first["meta_info"]["output_token_logprobs"]]
    # the fixed sequence, scored (one new token) before and after the update
    before = [
        float(t[0])
        for t in _generate(server, seq, logprob_start_len=0)["meta_info"]["input_token_logprobs"][1:]
    ]
    resp = httpx.post(
        f"{server}/update_weights_from_disk", json={"model_path": str(models["b"])}, timeout=300
    )
    assert resp.status_code == 200 and resp.json().get("success"), resp.text
    try:
        after_res = _generate(server, seq, logprob_start_len=0)
        after = [float(t[0]) for t in after_res["meta_info"]["input_token_logprobs"][1:]]
        moved = _diff(after, torch.tensor(before))
        matches_b = _diff(after, _forward_logprobs(models["b"], seq))
        summary = {"moved": moved, "vs_new_model": matches_b}
        print("after /update_weights_from_disk:", json.dumps(summary))
        assert moved["mean"] > 20 * matches_b["mean"], (
            summary
        )  # other random weights: far apart (0.38 vs 0.0024)
        assert matches_b["mean"] <= MEAN_TOL and matches_b["max"] <= MAX_TOL, summary
    finally:
        httpx.post(f"{server}/update_weights_from_disk", json={"model_path": str(models["a"])}, timeout=300)
