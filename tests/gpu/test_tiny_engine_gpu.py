"""slime_ext/dev_engine/engine.py on a GPU (`--device cuda`): the tiny model written to disk, loaded onto
the GPU in float32 and bfloat16, serving sampled and SCRIPTED MIX answers whose log-probs are the
model's on that device.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_tiny_engine_gpu.py`.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _fresh_logprobs(engine, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + ids], device="cuda")).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)] / temperature, dim=-1)
    return [float(lp[i, t]) for i, t in enumerate(ids)]


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-3), ("bfloat16", 0.1)])
def test_engine_on_cuda_samples_and_scripted_mix(tmp_path: Path, dtype: str, tol: float) -> None:
    from eval_server import samples
    from slime_ext.dev_engine.engine import load_engine
    from slime_ext.dev_engine.tiny_model import write_model_dir
    from slime_ext.rollout.chat import ChatRenderer
    from slime_ext.rollout.prompts import PromptConfig, build_messages

    engine = load_engine(
        str(write_model_dir(tmp_path / "model")), seed=0, scripted_mix=0.5, device="cuda", dtype=dtype
    )
    assert engine.device.type == "cuda" and engine.model.dtype == getattr(torch, dtype)
    renderer = ChatRenderer(engine.tokenizer)
    prompt = renderer.prompt_ids(build_messages(samples.load_problem("relu"), PromptConfig()))
    other = engine.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    url = engine.start()
    try:
        body = {"sampling_params": {"temperature": 1.0, "max_new_tokens": 2048}, "return_logprob": True}
        scripted = [
            httpx.post(f"{url}/generate", json={**body, "input_ids": prompt}, timeout=300).json()
            for _ in range(3)
        ]
        sampled = httpx.post(
            f"{url}/generate",
            json={**body, "input_ids": other, "sampling_params": {"max_new_tokens": 16}},
            timeout=300,
        ).json()
        info = httpx.get(f"{url}/get_model_info").json()
    finally:
        engine.stop()
    assert info["device"].startswith("cuda") and info["dtype"] == dtype
    assert {s["meta_info"]["scripted"]["correct"] for s in scripted} == {True, False}
    for data in scripted:
        entries = data["meta_info"]["output_token_logprobs"]
        ids = [e[1] for e in entries]
        assert [e[0] for e in entries] == pytest.approx(_fresh_logprobs(engine, prompt, ids, 1.0), abs=tol)
    entries = sampled["meta_info"]["output_token_logprobs"]
    assert "scripted" not in sampled["meta_info"] and 1 <= len(entries) <= 16
    assert all(math.isfinite(e[0]) and e[0] <= 0 for e in entries)
    ids = [e[1] for e in entries]
    assert [e[0] for e in entries] == pytest.approx(_fresh_logprobs(engine, other, ids, 1.0), abs=tol)
