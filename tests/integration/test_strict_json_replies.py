"""Every reply of every server parses with a strict JSON parser (one that rejects the NaN /
Infinity / -Infinity literals): the real eval server judging a candidate whose output is full of
infinities (max_abs_diff: null), the real buffer server's /stats and JSON /batches, and the tiny
engine's /generate with a -inf log-prob (null)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
import torch

from eval_server import samples
from slime_ext.dev_engine.engine import GenerateEngine
from slime_ext.dev_engine.tiny_model import tiny_model, tiny_tokenizer
from tests.integration.test_buffer_server_http import buffer_server, record

pytestmark = pytest.mark.integration


def raise_error(name: str):
    raise ValueError(f"non-standard JSON constant {name} in a reply")


def strict_loads(body: bytes):
    return json.loads(body, parse_constant=raise_error)


def inf_candidate() -> str:
    """The bundled wrong-math ReLU candidate with its kernel writing x / (x - x) instead: +inf
    where x > 0, -inf where x < 0, NaN where x == 0 (run under the Triton interpreter)."""
    source = samples.load_candidate("relu__wrong_math")
    assert source.count("tl.maximum(x, 0.0) * 0.5") == 1
    return source.replace("tl.maximum(x, 0.0) * 0.5", "x / (x - x)")


def test_eval_reply_with_infinite_difference_is_standard_json(cpu_server: str) -> None:
    payload = {
        "reference": samples.load_problem("relu"),
        "candidate": inf_candidate(),
        "options": {"correctness_trials": 2},
        "problem_id": "relu",
        "request_id": "inf-output",
    }
    reply = httpx.post(f"{cpu_server}/eval", json=payload, timeout=180)
    assert reply.status_code == 200, reply.text
    assert b"Infinity" not in reply.content and b"NaN" not in reply.content
    result = strict_loads(reply.content)
    assert result["status"] == "incorrect", result
    assert "max_abs_diff" in result and result["max_abs_diff"] is None
    assert all(t["max_abs_diff"] is None and not t["passed"] for t in result["trials"])
    assert "max abs diff inf" in result["feedback"]  # the text still says it was infinite
    # the server's other JSON replies after it (stats carry the latency figures) are strict too
    for path in ("/stats", "/health"):
        strict_loads(httpx.get(f"{cpu_server}{path}", timeout=30).content)
    strict_loads(httpx.post(f"{cpu_server}/eval", content=b"{", timeout=30).content)  # a 400


def test_eval_reply_of_a_correct_sample_is_standard_json(cpu_server: str) -> None:
    payload = {
        "reference": samples.load_problem("relu"),
        "candidate": samples.load_candidate("relu__correct"),
        "options": {"correctness_trials": 2},
    }
    reply = httpx.post(f"{cpu_server}/eval", json=payload, timeout=180)
    assert strict_loads(reply.content)["status"] == "ok"


def test_buffer_server_json_replies_are_standard_json(tmp_path: Path) -> None:
    with buffer_server(tmp_path, tmp_path / "buffer.sqlite", "--group-size", "2") as svc:
        url = svc.url
        strict_loads(httpx.get(f"{url}/stats").content)  # empty store: no mean of nothing as NaN
        put = httpx.post(f"{url}/trajectories", json={"records": [record(f"u{i}", "g", i) for i in range(2)]})
        assert strict_loads(put.content)["accepted"] == 2
        stats = httpx.get(f"{url}/stats")
        assert stats.status_code == 200 and strict_loads(stats.content)["records"]["total"] == 2
        strict_loads(httpx.get(f"{url}/health").content)
        batch = httpx.post(f"{url}/batches", json={"num_groups": 1, "timeout_s": 0}, timeout=30)
        assert batch.headers["content-type"].startswith("application/json")
        reply = strict_loads(batch.content)
        assert len(reply["groups"]) == 1 and len(reply["groups"][0]["records"]) == 2
        ack = httpx.post(f"{url}/batches/ack", json={"lease_id": reply["lease_id"]})
        strict_loads(ack.content)
        strict_loads(httpx.post(f"{url}/batches", content=b"[", timeout=30).content)  # a 400
        strict_loads(httpx.get(f"{url}/stats").content)


def test_tiny_engine_writes_a_minus_inf_logprob_as_null() -> None:
    model = tiny_model()  # shared (cached): the hook below is removed again
    tok = tiny_tokenizer()
    banned = tok.encode("x", add_special_tokens=False)[0]
    prompt = tok.encode("<|im_start|>user\nrelu<|im_end|>\n<|im_start|>assistant\n")

    def forbid(_module, _inputs, output):  # the model gives the scripted answer's token no mass
        output.logits[..., banned] = -math.inf
        return output

    hook = model.register_forward_hook(forbid)
    engine = GenerateEngine(model, tok, seed=0, model_path="tiny", scripted_rules=[("relu", "x")])
    url = engine.start()
    try:
        with torch.no_grad():  # the hook really gives -inf (what the reply would have carried)
            logits = model(input_ids=torch.tensor([prompt + [banned]])).logits[0, -2].float()
        assert torch.log_softmax(logits, dim=-1)[banned].item() == -math.inf
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
        reply = httpx.post(f"{url}/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        entries = strict_loads(reply.content)["meta_info"]["output_token_logprobs"]
        assert entries[0][0] is None and entries[0][1] == banned  # log-prob -inf -> null
        assert all(isinstance(e[0], float) and e[0] <= 0 for e in entries[1:])
        strict_loads(httpx.get(f"{url}/get_model_info").content)
    finally:
        engine.stop()
        hook.remove()
