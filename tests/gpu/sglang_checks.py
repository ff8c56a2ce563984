"""What the GPU tests ask of an SGLang server: a sample problem's prompt as the episode renders it,
`/generate` token in / token out with log-probs, and a float32 transformers forward of the same
weights to compare them with (bf16 serving vs float32: per-token log-prob tolerances below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

MEAN_TOL = 0.05  # nats, mean over the tokens
MAX_TOL = 0.3  # nats, worst token
NEW_TOKENS = 48


def prompt_ids(model_dir: Path) -> list[int]:
    """A sample problem's first-turn prompt, rendered as the episode renders it."""
    from transformers import AutoTokenizer

    from eval_server import samples
    from slime_ext.rollout.prompts import build_messages

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = build_messages(samples.load_problem("relu"))
    return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def forward_logprobs(model_dir: Path, ids: list[int]) -> Any:
    """log p(ids[i] | ids[:i]) for i >= 1 from a float32 transformers forward on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:], device="cuda")[:, None])[:, 0]
    del model
    torch.cuda.empty_cache()
    return lp.cpu()


def generate(url: str, ids: list[int], **extra: Any) -> dict[str, Any]:
    """`/generate` of NEW_TOKENS tokens at temperature 1 with log-probs; asserts HTTP 200."""
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


def diff(served: list[float], reference: Any) -> dict[str, float]:
    import torch

    d = (torch.tensor(served) - reference).abs()
    return {"mean": float(d.mean()), "max": float(d.max()), "n": len(served)}


def served_vs_forward(url: str, model_dir: Path) -> dict[str, Any]:
    """Generate from the relu prompt; the served log-probs of the generated and of the prompt
    tokens against the forward of `model_dir`."""
    ids = prompt_ids(model_dir)
    meta = generate(url, ids, logprob_start_len=0)["meta_info"]
    out = meta["output_token_logprobs"]
    out_ids = [int(t[1]) for t in out]
    ref = forward_logprobs(model_dir, ids + out_ids)
    return {
        "prompt_tokens": len(ids),
        "finish_reason": meta["finish_reason"]["type"],
        "generated_tokens": len(out_ids),
        "generated": diff([float(t[0]) for t in out], ref[len(ids) - 1 :]),
        # the first prompt token has no log-prob
        "prompt": diff([float(t[0]) for t in meta["input_token_logprobs"][1:]], ref[: len(ids) - 1]),
    }
