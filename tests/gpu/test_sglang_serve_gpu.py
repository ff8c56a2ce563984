"""SGLang serves our tiny model token in / token out, with log-probs a transformers forward agrees
with, and takes new weights.

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

import httpx
import pytest

from tests.gpu.launched import artifacts, sglang_server
from tests.gpu.sglang_checks import (
    MAX_TOL,
    MEAN_TOL,
    NEW_TOKENS,
    diff,
    forward_logprobs,
    generate,
    prompt_ids,
    served_vs_forward,
)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines never select this marker
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("sglang", reason="needs sglang (scripts/gpu_env/trainer.lock)")

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("KRL_SGLANG_START_TIMEOUT_S", "600"))
ATTENTION_BACKEND = os.environ.get("KRL_SGLANG_ATTENTION_BACKEND", "triton")


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


def test_generate_token_in_token_out_logprobs_match_transformers(
    server: str, models: dict[str, Path]
) -> None:
    summary = {**served_vs_forward(server, models["a"]), "model": "hd64-a"}
    if (art := artifacts()) is not None:
        art.mkdir(parents=True, exist_ok=True)
        (art / "sglang_logprobs.json").write_text(json.dumps(summary, indent=1))
    print("sglang vs transformers log-probs:", json.dumps(summary))
    assert summary["generated_tokens"] == NEW_TOKENS and summary["finish_reason"] == "length", summary
    gen, prompt = summary["generated"], summary["prompt"]
    assert gen["mean"] <= MEAN_TOL and gen["max"] <= MAX_TOL, summary
    assert prompt["mean"] <= MEAN_TOL and prompt["max"] <= MAX_TOL, summary


def test_new_weights_change_what_sglang_serves(server: str, models: dict[str, Path]) -> None:
    ids = prompt_ids(models["a"])
    first = generate(server, ids, logprob_start_len=0)
    seq = ids + [int(t[1]) for t in first["meta_info"]["output_token_logprobs"]]
    # the fixed sequence, scored (one new token) before and after the update
    before = [
        float(t[0])
        for t in generate(server, seq, logprob_start_len=0)["meta_info"]["input_token_logprobs"][1:]
    ]
    resp = httpx.post(
        f"{server}/update_weights_from_disk", json={"model_path": str(models["b"])}, timeout=300
    )
    assert resp.status_code == 200 and resp.json().get("success"), resp.text
    try:
        after_res = generate(server, seq, logprob_start_len=0)
        after = [float(t[0]) for t in after_res["meta_info"]["input_token_logprobs"][1:]]
        moved = diff(after, torch.tensor(before))
        matches_b = diff(after, forward_logprobs(models["b"], seq))
        summary = {"moved": moved, "vs_new_model": matches_b}
        print("after /update_weights_from_disk:", json.dumps(summary))
        assert moved["mean"] > 20 * matches_b["mean"], (
            summary
        )  # other random weights: far apart (0.38 vs 0.0024)
        assert matches_b["mean"] <= MEAN_TOL and matches_b["max"] <= MAX_TOL, summary
    finally:
        httpx.post(f"{server}/update_weights_from_disk", json={"model_path": str(models["a"])}, timeout=300)
