"""The chat-endpoint client (httpx MockTransport as the endpoint: the OpenAI wire format) and the
text-level multi-turn loop (with a scripted evaluator): payload, retries, errors, turns, rewards,
stops and statuses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from eval_server.samples import load_problem
from eval_server.schema import EvalResult
from slime_ext.clients.eval_client import EvalUnavailableError
from slime_ext.reports import chat_policy
from slime_ext.reports.chat_policy import (
    ChatClient,
    ChatError,
    ChatRequestError,
    ChatTimeoutError,
    ChatUnavailableError,
    chat_completions_url,
    chat_template_kwargs,
    run_chat_episode,
)
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.prompts import DEFAULT_NO_CODE_FEEDBACK
from slime_ext.rollout.rewards import RewardConfig

pytestmark = pytest.mark.unit

F = "```"


def completion(content: str, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3},
    }


class Endpoint:
    """Queued answers: dicts (200 JSON), (status, body) tuples, or exceptions to raise."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        self.bodies.append(json.loads(request.content))
        self.headers.append(request.headers)
        item = self.answers.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, tuple):
            return httpx.Response(item[0], json=item[1], headers=item[2] if len(item) > 2 else None)
        return httpx.Response(200, json=item)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []

    async def fake_sleep(s: float) -> None:
        waits.append(s)

    monkeypatch.setattr(chat_policy, "_sleep", fake_sleep)
    return waits


def client(endpoint: Endpoint, **kw: Any) -> ChatClient:
    kw.setdefault("model", "m")
    kw.setdefault("temperature", 0.6)
    return ChatClient("http://h:1/v1", transport=httpx.MockTransport(endpoint), **kw)


def complete(c: ChatClient, messages=None, **kw: Any):
    async def go():
        async with c:
            return await c.complete(messages or [{"role": "user", "content": "hi"}], **kw)

    return asyncio.run(go())


def test_url_forms() -> None:
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://api.x/v1/chat/completions") == "https://api.x/v1/chat/completions"


def test_payload_auth_and_parsing() -> None:
    ep = Endpoint([completion("answer", reasoning_content="thought")])
    c = client(
        ep,
        max_tokens=100,
        top_p=0.9,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        api_key="k",
    )
    out = complete(c, max_tokens=50, seed=3)
    body = ep.bodies[0]
    assert body["model"] == "m" and body["temperature"] == 0.6 and body["max_tokens"] == 50
    assert body["top_p"] == 0.9 and body["seed"] == 3 and body["n"] == 1 and body["stream"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert ep.headers[0]["authorization"] == "Bearer k"
    assert (out.content, out.reasoning, out.finish_reason, out.completion_tokens) == (
        "answer",
        "thought",
        "stop",
        3,
    )
    with pytest.raises(ValueError, match="extra_body may not set"):
        client(ep, extra_body={"temperature": 1.0})


def test_retries_then_success(no_sleep: list[float]) -> None:
    ep = Endpoint(
        [
            httpx.ConnectError("refused"),
            (503, {"error": "busy"}, {"Retry-After": "2"}),
            (429, {"error": "slow down"}),
            completion("ok"),
        ]
    )
    assert complete(client(ep, max_retries=3)).content == "ok"
    assert len(ep.bodies) == 4 and len(no_sleep) == 3 and no_sleep[1] >= 2.0


@pytest.mark.parametrize(
    ("answers", "error", "match"),
    [
        ([(400, {"error": {"message": "model not found"}})], ChatRequestError, "model not found"),
        ([(500, {"error": "boom"})], ChatError, "unexpected HTTP 500"),
        ([{"choices": []}], ChatError, "malformed"),
        ([httpx.ReadTimeout("slow")], ChatTimeoutError, "timeout"),
        ([(503, {})] * 3, ChatUnavailableError, "after 3 attempt"),
    ],
)
def test_errors(answers, error, match) -> None:
    ep = Endpoint(answers)
    with pytest.raises(error, match=match):
        complete(client(ep, max_retries=2))
    assert ep.answers == []  # nothing retried beyond what the rule allows


class ScriptedEvaluator:
    """Stand-in for EvalClient: answers queued results (or raises queued exceptions)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = list(results)
        self.candidates: list[str] = []

    async def evaluate_source(self, reference: str, candidate: str, **kw: Any) -> EvalResult:
        self.candidates.append(candidate)
        item = self.results.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def episode(answers: list[Any], results: list[Any], **cfg: Any):
    ep = Endpoint(answers)
    ev = ScriptedEvaluator(results)

    async def go():
        async with client(ep) as c:
            return await run_chat_episode(
                {"reference": load_problem("relu"), "problem_id": "relu"},
                chat=c,
                evaluator=ev,
                config=EpisodeConfig(**cfg),
                seed=100,
            )

    return asyncio.run(go()), ep, ev


def test_wrong_then_correct_with_feedback() -> None:
    out, ep, ev = episode(
        [
            completion(f"try\n{F}python\nv1\n{F}"),
            completion(f"{F}python\nv2\n{F}", reasoning_content="think"),
        ],
        [
            EvalResult(status="incorrect", compiled=True, feedback="FEEDBACK-1 max diff 0.5"),
            EvalResult(status="ok", compiled=True, correct=True, speedup=2.5, feedback="fast"),
        ],
        max_turns=3,
    )
    assert ev.candidates == ["v1", "v2"]
    assert [t.reward for t in out.turns] == pytest.approx([0.1, 1.8])
    assert out.early_stopped and out.status == "completed" and len(out.turns) == 2
    assert out.turns[1].text.startswith("<think>\nthink\n</think>")
    second = ep.bodies[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "FEEDBACK-1" in second[3]["content"] and "Fix the problem" in second[3]["content"]
    assert second[2]["content"].startswith("try")  # content only is sent back
    assert [b["seed"] for b in ep.bodies] == [100, 101]
    assert set(out.timing) == {"total_s", "generate_s", "eval_s"}


def test_no_code_then_length_on_last_turn_is_truncated() -> None:
    out, ep, ev = episode([completion("no code here"), completion("cut", "length")], [], max_turns=2)
    assert ev.candidates == [] and [t.reward for t in out.turns] == [0.0, 0.0]
    assert ep.bodies[1]["messages"][-1]["content"] == DEFAULT_NO_CODE_FEEDBACK
    assert out.status == "truncated"


def test_aborts_and_refusals() -> None:
    out, _, _ = episode([completion("x", "abort")], [])
    assert out.status == "aborted" and "aborted" in out.abort_reason
    out, _, _ = episode([completion(f"{F}python\nv\n{F}")], [EvalUnavailableError("down")])
    assert out.status == "aborted" and "EvalUnavailableError" in out.abort_reason
    out, _, _ = episode([completion(f"{F}python\nv\n{F}")], [EvalResult(status="server_error")])
    assert out.status == "aborted" and "server_error" in out.abort_reason
    # a refusal on a later turn: the conversation outgrew the endpoint
    out, _, _ = episode(
        [completion("none"), (400, {"error": {"message": "context length exceeded"}})], [], max_turns=3
    )
    assert out.status == "truncated" and len(out.turns) == 1
    # on the first turn it is a configuration error
    with pytest.raises(ChatRequestError):
        episode([(400, {"error": {"message": "unknown model"}})], [])


def test_any_correct_stops_when_configured_and_template_kwargs() -> None:
    out, _, _ = episode(
        [completion(f"{F}python\nv\n{F}")],
        [EvalResult(status="ok", compiled=True, correct=True)],
        reward=RewardConfig(early_stop_min_speedup=None),
    )
    assert out.early_stopped and [t.reward for t in out.turns] == [0.3]
    assert chat_template_kwargs(EpisodeConfig()) == {}
    cfg = EpisodeConfig(enable_thinking=False, chat_template_kwargs={"a": 1})
    assert chat_template_kwargs(cfg) == {"a": 1, "enable_thinking": False}
