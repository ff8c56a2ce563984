"""slime_ext.clients.sglang_client against an in-process httpx transport (no network)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from slime_ext.clients import sglang_client
from slime_ext.clients.sglang_client import (
    SGLangClient,
    SGLangError,
    SGLangTimeoutError,
    SGLangUnavailableError,
    parse_generate_response,
)

pytestmark = pytest.mark.unit


def answer(ids: list[int], finish: dict[str, Any], prompt_tokens: int = 3) -> dict[str, Any]:
    return {
        "text": "t" * len(ids),
        "meta_info": {
            "output_token_logprobs": [[-0.5 * (i + 1), t, "t"] for i, t in enumerate(ids)],
            "finish_reason": finish,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(ids),
        },
    }


class Recorder:
    def __init__(self, responses: list[Any]) -> None:
        self.responses = list(responses)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        item = self.responses.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, httpx.Response):
            return item
        return httpx.Response(200, json=item)


def client(rec: Recorder, **kw: Any) -> SGLangClient:
    kw.setdefault("temperature", 0.8)
    kw.setdefault("max_context_len", 100)
    kw.setdefault("default_max_new_tokens", 50)
    return SGLangClient("127.0.0.1:30000", transport=httpx.MockTransport(rec), **kw)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []

    async def fake_sleep(s: float) -> None:
        waits.append(s)

    monkeypatch.setattr(sglang_client, "_sleep", fake_sleep)
    return waits


def run(coro):
    return asyncio.run(coro)


def test_request_format_and_parse() -> None:
    rec = Recorder([answer([7, 8, 2], {"type": "stop", "matched": 2})])
    c = client(rec, sampling_params={"top_p": 1.0, "stop_token_ids": [2]})
    gen = run(c.generate([1, 2, 3]))
    body = rec.bodies[0]
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "top_p": 1.0,
            "stop_token_ids": [2],
            "temperature": 0.8,
            "max_new_tokens": 50,
        },
        "return_logprob": True,
    }
    assert gen.token_ids == [7, 8, 2]
    assert gen.logprobs == [-0.5, -1.0, -1.5]
    assert gen.finish_reason == "stop" and gen.finish_detail["matched"] == 2
    assert gen.prompt_tokens == 3 and gen.requested_max_new_tokens == 50


def test_max_new_tokens_clamped_to_context_budget() -> None:
    rec = Recorder([answer([5] * 10, {"type": "length", "length": 10})])
    gen = run(client(rec).generate(list(range(90)), max_new_tokens=40))
    assert rec.bodies[0]["sampling_params"]["max_new_tokens"] == 10
    assert gen.finish_reason == "length"


@pytest.mark.parametrize("n_input", [100, 120])
def test_no_budget_no_call(n_input: int) -> None:
    rec = Recorder([])
    gen = run(client(rec).generate(list(range(n_input))))
    assert rec.bodies == [] and gen.token_ids == [] and gen.finish_reason == "length"


def test_temperature_must_match() -> None:
    rec = Recorder([answer([1], {"type": "stop"})] * 2)
    c = client(rec)
    with pytest.raises(ValueError, match="rollout temperature"):
        run(c.generate([1], temperature=1.0))
    with pytest.raises(ValueError, match="rollout temperature"):
        run(c.generate([1], sampling_params={"temperature": 0.5}))
    with pytest.raises(ValueError):
        client(rec, sampling_params={"temperature": 0.7})
    run(c.generate([1], temperature=0.8))  # equal is fine
    assert rec.bodies[0]["sampling_params"]["temperature"] == 0.8


def test_connection_errors_retried_with_backoff(no_sleep: list[float]) -> None:
    rec = Recorder(
        [httpx.ConnectError("refused"), httpx.ConnectError("refused"), answer([4], {"type": "stop"})]
    )
    gen = run(client(rec, max_retries=3).generate([1]))
    assert gen.token_ids == [4] and len(rec.bodies) == 3 and len(no_sleep) == 2
    assert no_sleep[1] >= no_sleep[0] * 0.5


def test_connection_errors_exhausted() -> None:
    rec = Recorder([httpx.ConnectError("refused")] * 3)
    with pytest.raises(SGLangUnavailableError):
        run(client(rec, max_retries=2).generate([1]))
    assert len(rec.bodies) == 3


def test_read_timeout_not_retried() -> None:
    rec = Recorder([httpx.ReadTimeout("slow"), answer([1], {"type": "stop"})])
    with pytest.raises(SGLangTimeoutError):
        run(client(rec).generate([1]))
    assert len(rec.bodies) == 1


def test_http_error_not_retried() -> None:
    rec = Recorder([httpx.Response(500, text="boom"), answer([1], {"type": "stop"})])
    with pytest.raises(SGLangError, match="HTTP 500"):
        run(client(rec).generate([1]))
    assert len(rec.bodies) == 1


def test_abort_and_length_are_statuses() -> None:
    rec = Recorder(
        [answer([], {"type": "abort", "message": "x"}), answer([3, 3], {"type": "length", "length": 2})]
    )
    c = client(rec)
    assert run(c.generate([1])).finish_reason == "abort"
    assert run(c.generate([1])).finish_reason == "length"


def test_parse_rejects_malformed() -> None:
    with pytest.raises(SGLangError):
        parse_generate_response({"text": "x"})
    with pytest.raises(SGLangError):
        parse_generate_response(
            {"meta_info": {"finish_reason": {"type": "weird"}, "output_token_logprobs": []}}
        )
    with pytest.raises(SGLangError):
        parse_generate_response({"meta_info": {"finish_reason": {"type": "stop"}}})
    with pytest.raises(SGLangError):
        parse_generate_response(
            {"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[None, 3, "x"]]}}
        )
    with pytest.raises(SGLangError, match="completion_tokens"):
        parse_generate_response(
            {
                "meta_info": {
                    "finish_reason": {"type": "stop"},
                    "output_token_logprobs": [[-1.0, 3, "x"]],
                    "completion_tokens": 2,
                }
            }
        )
    # an abort may come without logprobs; a batch answer of one element is accepted
    gen = parse_generate_response([{"meta_info": {"finish_reason": {"type": "abort"}}}])
    assert gen.finish_reason == "abort" and gen.token_ids == []
